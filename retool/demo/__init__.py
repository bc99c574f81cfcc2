"""``make demo``: the platform's steps around training, for real, on 127.0.0.1 (see ``pipeline``)."""
