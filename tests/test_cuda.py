"""What only a real CUDA GPU can show: the checks of lmtune.tools.cuda_checks (which ``python -m
lmtune.gpu_check`` runs on a machine with one, installed or not), each a test here. Skipped elsewhere: no
machine of this project has a GPU; tests/test_gpu_paths.py exercises the same decisions on the CPU."""

from __future__ import annotations

import pytest
import torch

from lmtune.tools.cuda_checks import (
    check_a_training_step_on_the_gpu_never_synchronizes,
    check_device_batches_on_cuda_match_the_cpu_batches,
    check_the_quick_model_trains_compiled_in_bf16_on_the_gpu,
)

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_device_batches_on_cuda_match_the_cpu_batches(builtin_data, tmp_path):
    check_device_batches_on_cuda_match_the_cpu_batches(builtin_data, tmp_path)


def test_the_quick_model_trains_compiled_in_bf16_on_the_gpu(builtin_data, tmp_path):
    check_the_quick_model_trains_compiled_in_bf16_on_the_gpu(builtin_data, tmp_path)


def test_a_training_step_on_the_gpu_never_synchronizes(builtin_data, tmp_path):
    check_a_training_step_on_the_gpu_never_synchronizes(builtin_data, tmp_path)
