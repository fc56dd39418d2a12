"""A step hook (--step-hook hooks:record_pid): writes the trial process's id into its folder."""

import os


def record_pid(config, out_dir):
    (out_dir / "pid.txt").write_text(str(os.getpid()))
