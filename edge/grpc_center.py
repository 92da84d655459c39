"""Escalation to one center over gRPC V2 (``grpc://`` / ``grpcs://``).

The generated stubs (package ``inference``) are imported on first use, not with this module:
one process can hold one ``inference`` package, and a program that imports the edge's modules
may hold tritonclient's.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np

from edge.call import CENTER_NAME, Call, CenterAnswer, Refused, retry_after
from edge.centers import CenterURL
from serving.telemetry import tracing

METHOD = "inference.GRPCInferenceService/ModelInfer"


class GrpcCenter:
    """One center's ``ModelInfer`` over its own channel, opened on the first call (inside the
    event loop that makes it). ``ca`` (the fleet CA): gRPC over TLS only, to a certificate
    carrying the center's TLS name."""

    def __init__(self, center: CenterURL, timeout_s: float, ca: Path | None) -> None:
        self.url, self.center, self.timeout_s, self.ca = center.url, center, timeout_s, ca
        self._channel: grpc.aio.Channel | None = None

    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            if self.center.tls:
                credentials = grpc.ssl_channel_credentials(
                    self.ca.read_bytes() if self.ca is not None else None)
                self._channel = grpc.aio.secure_channel(self.center.address, credentials, options=[
                    ("grpc.ssl_target_name_override", self.center.tls_name or CENTER_NAME)]
                    if self.ca else [])
            else:
                self._channel = grpc.aio.insecure_channel(self.center.address)
        return self._channel

    async def classify(self, call: Call) -> CenterAnswer:
        if self.ca is not None and not self.center.tls:
            raise Refused("not TLS (center_ca is set)")
        from serving.gen import grpc_predict_v2_pb2 as pb  # see the module docstring

        request = call.message()
        metadata: dict[str, str] = {"x-request-id": call.request_id} if call.request_id else {}
        with tracing.span(METHOD, tracing.SpanKind.CLIENT, **{
                "rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService",
                "rpc.method": "ModelInfer", "server.address": self.url,
                "tiered.escalated": call.rows}) as span:
            tracing.inject(metadata)
            try:
                response = await self.channel().unary_unary(
                    f"/{METHOD}", request_serializer=pb.ModelInferRequest.SerializeToString,
                    response_deserializer=pb.ModelInferResponse.FromString)(
                    request, timeout=self.timeout_s, metadata=tuple(metadata.items()))
            except grpc.aio.AioRpcError as exc:
                if span is not None:
                    span.set_attribute("rpc.grpc.status_code", exc.code().value[0])
                raise _refused(exc) from None
        try:
            names = [o.name for o in response.outputs]
            raw = response.raw_output_contents[names.index("probabilities")]
            probabilities = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(
                call.rows, call.labels)
        except (ValueError, IndexError) as exc:
            raise Refused(f"unusable answer ({exc})") from exc
        return CenterAnswer(probabilities, response.model_version, self.url)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def _refused(exc: grpc.aio.AioRpcError) -> Refused:
    code = exc.code()
    cooldown = (retry_after(dict(exc.trailing_metadata() or ()).get("retry-after"))
                if code == grpc.StatusCode.UNAVAILABLE else None)
    # the caller's mistakes (a model the center does not have yet, say) say nothing about the
    # center's health; everything else does
    client_side = code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.FAILED_PRECONDITION)
    return Refused(f"gRPC {code.name}", unhealthy=not client_side, cooldown=cooldown)
