"""More than one GPU: stage placement (``placement``), tensor-parallel ranks (``ranks``,
``group``, ``worker``, ``lockstep``, ``layers``) and the devices of data-parallel replicas (``placement``).
The replicas themselves are engine processes behind one HTTP server (``serve/replicas.py``)."""
