"""Contenders of the end-to-end benchmark (``python -m benchmarks.e2e``), one module each.

- :mod:`.ddp`: synchronous data parallel, torch.distributed (gloo) gradient all-reduce every step;
- :mod:`.hivemind_opt`: ``hivemind.Optimizer`` in its collaborative large-batch mode;
- :mod:`.diloco`: flat DiLoCo on hivemind's ``DecentralizedAverager`` (the OpenDiLoCo recipe,
  through :class:`geotrain.sync.hivemind_backend.HivemindDiLoCoSync`);
- :mod:`.geotrain_run`: geotrain itself (``geotrain dht`` + ``geotrain peer`` x N + ``geotrain run``).

The first three are *worker* programs (``python -m benchmarks.contenders.ddp --spec ...``),
one process per peer, sharing :mod:`.common` (spec, model, data, snapshots, the start
barrier). :mod:`.launch` starts processes (inside emulated regions when there are
namespaces) and reads the kernel's byte counters; :mod:`.results` turns snapshots into
validation curves, time to target, USD and the JSON lines.
"""
