"""Media: decode bytes/arrays (``audio``, ``image``, ``video``; limits in ``limits``) and turn them
into model inputs in torch on any device (``mel`` for log-mel, ``patches`` for vision patches)."""
