"""Pipeline stages across peers: microbatch schedules, the stage runtime, per-hop codecs.

- :class:`StageConfig`: one stage's settings (schedule, microbatches, codecs per hop, timeouts, AdamW).
- :class:`StageRuntime`: runs one stage one inner step at a time over a :class:`geotrain.transport.Transport`.
- :class:`StepMetrics`: compute/recv/send time, bubble fraction, bytes per hop, dropped messages.
- :func:`make_schedule`: GPipe and 1F1B op lists.
- :class:`LocalPipeline`: all stages of one pipeline in one process (threads + real loopback transports).
"""

from geotrain.pipeline.config import StageConfig
from geotrain.pipeline.local import LocalPipeline
from geotrain.pipeline.runtime import StageRuntime, StepMetrics
from geotrain.pipeline.schedule import make_schedule, max_in_flight_of

__all__ = ["LocalPipeline", "StageConfig", "StageRuntime", "StepMetrics", "make_schedule", "max_in_flight_of"]
