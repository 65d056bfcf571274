"""Every exception geotrain raises on purpose, in one tree.

::

    GeotrainError
    ├── ConfigError (ValueError)            bad job/scenario/component config; message says the fix
    │   ├── ScenarioError                   scenario file invalid or infeasible
    │   └── DataError                       unusable training data; names the file (and line)
    ├── InfeasiblePlanError (ValueError)    planner found no assignment; names what is missing
    ├── CodecError (ValueError)             codec misuse or a corrupted/truncated encoding
    │   └── NonFiniteError                  NaN/Inf where the policy forbids it
    ├── TransportError
    │   ├── ProtocolError (ValueError)      a malformed message from a peer (counted, dropped)
    │   │   ├── FrameTooLargeError          frame/header beyond a configured limit
    │   │   ├── BadTensorError              descriptor inconsistent with its buffer
    │   │   └── StaleMessageError           other job / plan version / round / stage
    │   ├── PeerTimeoutError (TimeoutError) a send/receive/hop missed its deadline; names peer and step
    │   └── AuthenticationError             CURVE/ZAP refusal, unknown member
    ├── SwarmError
    │   ├── RecordError (ValueError)        a DHT record failed schema, size, depth or signature checks
    │   ├── BootstrapError                  no initial peer reachable
    │   └── DHTTimeoutError (TimeoutError)  a DHT get/store missed its deadline
    ├── PipelineError
    │   └── StageFailedError                a neighbour stage died or timed out; names peer and step
    │       └── PlanSupersededError         a wait on a neighbour given up because a newer plan exists
    ├── SyncError
    │   ├── RoundAbortedError               this member cannot do its part; round discarded, progress kept
    │   └── BadContributionError            a member sent NaN/Inf/absurd-norm data; names the sender
    ├── StateTransferError                  joiner could not get verified state (size/hash mismatch)
    │   └── StateLostError                  past step 0, blocks no reachable peer holds (no seed restart)
    ├── CheckpointError                     no complete checkpoint, or a corrupt manifest
    │   └── CheckpointWriteError (OSError)  the disk refused a checkpoint write; training goes on
    └── EmulationError                      network emulation could not be set up (needs root, ...)

User-input errors derive from ``ValueError`` so callers that only know Python's
builtins still catch them. ``assert`` is kept for internal invariants.
"""

from __future__ import annotations


class GeotrainError(Exception):
    """Base of every error geotrain raises on purpose."""


# -- configuration and planning ---------------------------------------------------------------
class ConfigError(GeotrainError, ValueError):
    """A config value is wrong; the message names the field and the fix.

    One error may carry several (``errors``: every problem of a job file at once, one per line).
    """

    def __init__(self, message: str = "", *, errors: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.errors: tuple[str, ...] = errors if errors is not None else (message,)

    @classmethod
    def many(cls, errors: list[str] | tuple[str, ...]) -> ConfigError:
        """One error for all of ``errors`` (its message lists them, one per line, when there are several)."""
        errs = tuple(errors)
        if len(errs) == 1:
            return cls(errs[0])
        return cls(f"{len(errs)} problems:\n" + "\n".join(f"  - {e}" for e in errs), errors=errs)


class ScenarioError(ConfigError):
    """A scenario file is malformed or describes an impossible swarm."""


class DataError(ConfigError):
    """The training data cannot be used (missing, empty, malformed); the message names the file and line."""


class InfeasiblePlanError(GeotrainError, ValueError):
    """The planner found no assignment that satisfies the constraints (memory, connectivity)."""


# -- compression --------------------------------------------------------------------------------
class CodecError(GeotrainError, ValueError):
    """A codec was misused, or an encoding is corrupted or truncated."""


class NonFiniteError(CodecError):
    """A tensor holds NaN/Inf and the active policy refuses such input."""


# -- data plane ---------------------------------------------------------------------------------
class TransportError(GeotrainError):
    """Something went wrong on the ZMQ data plane."""


class ProtocolError(TransportError, ValueError):
    """A peer sent a malformed message. It is counted and dropped; the socket keeps serving."""


class FrameTooLargeError(ProtocolError):
    """A header or frame exceeds a configured size limit."""


class BadTensorError(ProtocolError):
    """A tensor descriptor disagrees with its buffer (dtype, shape, byte length)."""


class StaleMessageError(ProtocolError):
    """A message for another job, plan version, round or stage."""


class PeerTimeoutError(TransportError, TimeoutError):
    """A send, receive or pipeline hop missed its deadline."""

    def __init__(self, message: str, *, peer: str | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer
        self.step = step


class AuthenticationError(TransportError):
    """A peer was refused by CURVE/ZAP or is not a member of the swarm."""


# -- control plane ------------------------------------------------------------------------------
class SwarmError(GeotrainError):
    """Something went wrong on the DHT control plane."""


class RecordError(SwarmError, ValueError):
    """A DHT record failed its schema, size, nesting-depth, lifetime or signature check."""


class BootstrapError(SwarmError):
    """None of the initial peers could be reached."""


class DHTTimeoutError(SwarmError, TimeoutError):
    """A DHT operation missed its deadline."""


# -- training -----------------------------------------------------------------------------------
class PipelineError(GeotrainError):
    """A pipeline stage could not complete its schedule."""


class StageFailedError(PipelineError):
    """A neighbour stage died or timed out."""

    def __init__(self, message: str, *, peer: str | None = None, step: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer
        self.step = step


class PlanSupersededError(StageFailedError):
    """A step waiting on a neighbour gave up because a newer plan was published (the agent adopts it).

    Nothing of the step was applied; the peer does not report itself stalled.
    """


class LocalRankError(PipelineError):
    """A local rank of this peer (a helper process of ``--nproc-per-node``) died or missed a collective.

    The peer cannot compute its stage without it: it leaves the swarm (and is replanned around) rather
    than hang. ``rank`` names the rank when known.
    """

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class SyncError(GeotrainError):
    """A DiLoCo round could not complete."""


class RoundAbortedError(SyncError):
    """This member cannot do its part of a round (e.g. a shard it must send cannot be encoded): the round is
    discarded everywhere, local progress is kept for the next round. Raised and handled inside
    :mod:`geotrain.sync.round`; a round never raises it to its caller (the outcome says ``discarded``)."""


class BadContributionError(SyncError, ValueError):
    """A member's pseudo-gradient was NaN/Inf or of absurd norm; ``sender`` names it."""

    def __init__(self, message: str, *, sender: str | None = None) -> None:
        super().__init__(message)
        self.sender = sender


class StateTransferError(GeotrainError):
    """A joiner could not obtain verified stage state (size or hash mismatch, donor gone)."""


class StateLostError(StateTransferError):
    """Past step 0, ``blocks`` have no reachable holder at ``round``: the job stops instead of restarting them
    from the seed (unless ``checkpoint.allow_seed_restart``)."""

    def __init__(self, message: str, *, blocks: list[int], round: int) -> None:
        super().__init__(message)
        self.blocks = blocks
        self.round = round


class CheckpointError(GeotrainError):
    """No complete checkpoint was found, or a manifest is corrupt."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (disk full, read-only, a file where its directory goes, ...).

    Also an ``OSError``, so callers that only know the builtins still catch it. A peer logs and counts it
    and trains on: the next checkpoint round writes again.
    """


class EmulationError(GeotrainError):
    """Multi-region network emulation could not be set up or torn down."""
