"""The built-in corpus generator: its lexicon (``words``) and the stories composed from it (``stories``)."""
