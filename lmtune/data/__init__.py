"""Token data: the built-in corpus, preparing a data dir from text or token ids, reading it, and building batches."""
