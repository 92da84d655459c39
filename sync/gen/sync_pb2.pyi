from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_STATE_UNSPECIFIED: _ClassVar[AckState]
    DOWNLOADING: _ClassVar[AckState]
    ACTIVE: _ClassVar[AckState]
    FAILED: _ClassVar[AckState]
    REFUSED: _ClassVar[AckState]
    RETIRED: _ClassVar[AckState]
ACK_STATE_UNSPECIFIED: AckState
DOWNLOADING: AckState
ACTIVE: AckState
FAILED: AckState
REFUSED: AckState
RETIRED: AckState

class FollowerMessage(_message.Message):
    __slots__ = ("hello", "applied")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    hello: FollowHello
    applied: Applied
    def __init__(self, hello: _Optional[_Union[FollowHello, _Mapping]] = ..., applied: _Optional[_Union[Applied, _Mapping]] = ...) -> None: ...

class FollowHello(_message.Message):
    __slots__ = ("registry_id", "position", "position_digest", "head_seq", "head_hash", "signing_key_id")
    REGISTRY_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    POSITION_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    registry_id: str
    position: int
    position_digest: str
    head_seq: int
    head_hash: str
    signing_key_id: str
    def __init__(self, registry_id: _Optional[str] = ..., position: _Optional[int] = ..., position_digest: _Optional[str] = ..., head_seq: _Optional[int] = ..., head_hash: _Optional[str] = ..., signing_key_id: _Optional[str] = ...) -> None: ...

class Applied(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("id", "table", "op", "row")
    ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    id: int
    table: str
    op: str
    row: str
    def __init__(self, id: _Optional[int] = ..., table: _Optional[str] = ..., op: _Optional[str] = ..., row: _Optional[str] = ...) -> None: ...

class PrimaryMessage(_message.Message):
    __slots__ = ("batch", "resync", "heartbeat")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    resync: Resync
    heartbeat: Heartbeat
    def __init__(self, batch: _Optional[_Union[Batch, _Mapping]] = ..., resync: _Optional[_Union[Resync, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("changes", "last")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    last: bool
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class Resync(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("position", "term", "registry_id")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_ID_FIELD_NUMBER: _ClassVar[int]
    position: int
    term: int
    registry_id: str
    def __init__(self, position: _Optional[int] = ..., term: _Optional[int] = ..., registry_id: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("registry_id",)
    REGISTRY_ID_FIELD_NUMBER: _ClassVar[int]
    registry_id: str
    def __init__(self, registry_id: _Optional[str] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("data", "offset", "size", "sha256", "position")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    size: int
    sha256: str
    position: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class Held(_message.Message):
    __slots__ = ("model", "versions", "active")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    model: str
    versions: _containers.RepeatedScalarFieldContainer[int]
    active: int
    def __init__(self, model: _Optional[str] = ..., versions: _Optional[_Iterable[int]] = ..., active: _Optional[int] = ...) -> None: ...

class Platform(_message.Message):
    __slots__ = ("cpu", "machine", "features", "runtime")
    CPU_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    cpu: str
    machine: str
    features: _containers.RepeatedScalarFieldContainer[str]
    runtime: str
    def __init__(self, cpu: _Optional[str] = ..., machine: _Optional[str] = ..., features: _Optional[_Iterable[str]] = ..., runtime: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node_id", "tier", "region", "held", "platform", "root_version", "witness")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    ROOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WITNESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: str
    region: str
    held: _containers.RepeatedCompositeFieldContainer[Held]
    platform: Platform
    root_version: int
    witness: Witness
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[str] = ..., region: _Optional[str] = ..., held: _Optional[_Iterable[_Union[Held, _Mapping]]] = ..., platform: _Optional[_Union[Platform, _Mapping]] = ..., root_version: _Optional[int] = ..., witness: _Optional[_Union[Witness, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("model", "version", "state", "reason", "fidelity", "fidelity_rows", "platform", "directive_seq")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIDELITY_FIELD_NUMBER: _ClassVar[int]
    FIDELITY_ROWS_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_SEQ_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    state: AckState
    reason: str
    fidelity: float
    fidelity_rows: int
    platform: Platform
    directive_seq: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[AckState, str]] = ..., reason: _Optional[str] = ..., fidelity: _Optional[float] = ..., fidelity_rows: _Optional[int] = ..., platform: _Optional[_Union[Platform, _Mapping]] = ..., directive_seq: _Optional[int] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("le", "count")
    LE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    le: float
    count: int
    def __init__(self, le: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class QualityReport(_message.Message):
    __slots__ = ("model", "version", "window_s", "requests", "rows", "escalation_rate", "degraded_rate", "confidence", "mean_tokens", "tokens", "length_drift", "p50_ms", "p99_ms", "fidelity", "capacity_rows_s", "threshold", "budget_rows_s", "shed_rate", "audit_rows", "audit_agreement", "audit_expected", "audit_interval", "drift", "estimated_accuracy", "accuracy_interval", "confidence_psi", "confidence_drift", "input_shift", "input_outliers", "input_rows", "low_confidence_share")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ESCALATION_RATE_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_RATE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LENGTH_DRIFT_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    FIDELITY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_ROWS_S_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_ROWS_S_FIELD_NUMBER: _ClassVar[int]
    SHED_RATE_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ROWS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_PSI_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_DRIFT_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHIFT_FIELD_NUMBER: _ClassVar[int]
    INPUT_OUTLIERS_FIELD_NUMBER: _ClassVar[int]
    INPUT_ROWS_FIELD_NUMBER: _ClassVar[int]
    LOW_CONFIDENCE_SHARE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    window_s: float
    requests: int
    rows: int
    escalation_rate: float
    degraded_rate: float
    confidence: _containers.RepeatedCompositeFieldContainer[Bucket]
    mean_tokens: float
    tokens: _containers.RepeatedCompositeFieldContainer[Bucket]
    length_drift: float
    p50_ms: float
    p99_ms: float
    fidelity: float
    capacity_rows_s: float
    threshold: float
    budget_rows_s: float
    shed_rate: float
    audit_rows: int
    audit_agreement: float
    audit_expected: float
    audit_interval: float
    drift: bool
    estimated_accuracy: float
    accuracy_interval: float
    confidence_psi: float
    confidence_drift: bool
    input_shift: float
    input_outliers: float
    input_rows: int
    low_confidence_share: float
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., window_s: _Optional[float] = ..., requests: _Optional[int] = ..., rows: _Optional[int] = ..., escalation_rate: _Optional[float] = ..., degraded_rate: _Optional[float] = ..., confidence: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., mean_tokens: _Optional[float] = ..., tokens: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., length_drift: _Optional[float] = ..., p50_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., fidelity: _Optional[float] = ..., capacity_rows_s: _Optional[float] = ..., threshold: _Optional[float] = ..., budget_rows_s: _Optional[float] = ..., shed_rate: _Optional[float] = ..., audit_rows: _Optional[int] = ..., audit_agreement: _Optional[float] = ..., audit_expected: _Optional[float] = ..., audit_interval: _Optional[float] = ..., drift: _Optional[bool] = ..., estimated_accuracy: _Optional[float] = ..., accuracy_interval: _Optional[float] = ..., confidence_psi: _Optional[float] = ..., confidence_drift: _Optional[bool] = ..., input_shift: _Optional[float] = ..., input_outliers: _Optional[float] = ..., input_rows: _Optional[int] = ..., low_confidence_share: _Optional[float] = ...) -> None: ...

class NodeMessage(_message.Message):
    __slots__ = ("hello", "ack", "report", "trust")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    ack: Ack
    report: QualityReport
    trust: TrustState
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., report: _Optional[_Union[QualityReport, _Mapping]] = ..., trust: _Optional[_Union[TrustState, _Mapping]] = ...) -> None: ...

class TrustState(_message.Message):
    __slots__ = ("root_version", "timestamp_version", "expires", "stale", "error")
    ROOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    root_version: int
    timestamp_version: int
    expires: float
    stale: bool
    error: str
    def __init__(self, root_version: _Optional[int] = ..., timestamp_version: _Optional[int] = ..., expires: _Optional[float] = ..., stale: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class Trust(_message.Message):
    __slots__ = ("roots", "timestamp", "snapshot", "targets")
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    roots: _containers.RepeatedScalarFieldContainer[bytes]
    timestamp: bytes
    snapshot: bytes
    targets: bytes
    def __init__(self, roots: _Optional[_Iterable[bytes]] = ..., timestamp: _Optional[bytes] = ..., snapshot: _Optional[bytes] = ..., targets: _Optional[bytes] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("model", "version", "alias", "manifest", "manifest_sha256", "signature", "signing_key_id", "directive", "directive_signature")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNING_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    alias: str
    manifest: bytes
    manifest_sha256: str
    signature: bytes
    signing_key_id: str
    directive: bytes
    directive_signature: bytes
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., alias: _Optional[str] = ..., manifest: _Optional[bytes] = ..., manifest_sha256: _Optional[str] = ..., signature: _Optional[bytes] = ..., signing_key_id: _Optional[str] = ..., directive: _Optional[bytes] = ..., directive_signature: _Optional[bytes] = ...) -> None: ...

class Retire(_message.Message):
    __slots__ = ("model", "version", "directive", "directive_signature")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    directive: bytes
    directive_signature: bytes
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., directive: _Optional[bytes] = ..., directive_signature: _Optional[bytes] = ...) -> None: ...

class Witness(_message.Message):
    __slots__ = ("statement", "signature")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    statement: bytes
    signature: bytes
    def __init__(self, statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("registry", "report_interval_s")
    REGISTRY_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    registry: str
    report_interval_s: float
    def __init__(self, registry: _Optional[str] = ..., report_interval_s: _Optional[float] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("model", "controlled", "rows_per_s", "capacity_rows_s", "share")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTROLLED_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_ROWS_S_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    model: str
    controlled: bool
    rows_per_s: float
    capacity_rows_s: float
    share: float
    def __init__(self, model: _Optional[str] = ..., controlled: _Optional[bool] = ..., rows_per_s: _Optional[float] = ..., capacity_rows_s: _Optional[float] = ..., share: _Optional[float] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "release", "budget", "trust", "witness", "retire")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    TRUST_FIELD_NUMBER: _ClassVar[int]
    WITNESS_FIELD_NUMBER: _ClassVar[int]
    RETIRE_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    release: Release
    budget: Budget
    trust: Trust
    witness: Witness
    retire: Retire
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., trust: _Optional[_Union[Trust, _Mapping]] = ..., witness: _Optional[_Union[Witness, _Mapping]] = ..., retire: _Optional[_Union[Retire, _Mapping]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("sha256", "offset")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    offset: int
    def __init__(self, sha256: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset", "data", "size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    size: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., size: _Optional[int] = ...) -> None: ...

class IndexReply(_message.Message):
    __slots__ = ("index",)
    INDEX_FIELD_NUMBER: _ClassVar[int]
    index: bytes
    def __init__(self, index: _Optional[bytes] = ...) -> None: ...

class ChunksRequest(_message.Message):
    __slots__ = ("sha256", "chunks")
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    sha256: str
    chunks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sha256: _Optional[str] = ..., chunks: _Optional[_Iterable[int]] = ...) -> None: ...

class ChunkData(_message.Message):
    __slots__ = ("chunk", "data")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    data: bytes
    def __init__(self, chunk: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...
