"""``registry publish``, ``list``, ``show`` and ``pull``: releases into the catalog and out to a
model store."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import msgspec

from registry.cli import retire_commands, tables
from registry.cli.context import Context, emit, err, json_flag, out, pass_ctx, split_ref
from registry.publish.pull import pull
from registry.releases import waves
from registry.releases.names import check_name
from registry.settings import RegistrySettings
from registry.store.blobs import BlobStore
from serving.config.flags import options as settings_options
from serving.protocol.v2 import NUMERIC
from serving.release.manifest import RequestInput, TensorInput, TensorSpec, TextInput
from serving.release.store import ModelStore

WAVE_FLAGS = ("wave_pace", "wave_growth", "wave_bake_s", "wave_install_timeout_s",
              "wave_max_failures", "wave_max_agreement_drop", "wave_min_audit_rows",
              "wave_min_audit_nodes", "wave_max_drift_share", "wave_max_p99_ratio")


def wave_policy(settings: RegistrySettings, shares: str, given: dict[str, Any]) -> waves.WavePolicy:
    """A rollout's policy: ``shares`` (``1%,10%,100%``), each gate setting from its flag when
    given, else from the settings."""
    values = {key: given.get(key, getattr(settings, key)) for key in WAVE_FLAGS}
    return waves.WavePolicy(waves.parse_waves(shares), **{
        key.removeprefix("wave_"): value for key, value in values.items()}).check()


@click.command("publish")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", required=True, help="Model name: [a-z0-9][a-z0-9._-]*.")
@click.option("--canary", default="", help="Comma-separated node ids: roll out to these only "
              "(alias 'canary') until `registry promote`.")
@click.option("--waves", default=None, metavar="SHARES", help="Roll out to the edges in waves, "
              "e.g. 1%,10%,50%,100%, with a gate after each (`registry rollout`).")
@settings_options(RegistrySettings, WAVE_FLAGS)
@settings_options(RegistrySettings, ("min_fidelity", "tolerance", "confidence"))
@click.option("--force", is_flag=True, help="Publish even when fidelity is below the floor.")
@click.option("--skip-existing", is_flag=True,
              help="Do nothing if the latest version was built from identical source files.")
@click.option("--edge", "edge", type=click.Path(path_type=Path), default=None,
              help="Single TorchScript file only: a smaller edge model (TorchScript .pt or "
              "fp32 .onnx, the same inputs and labels) for a cascade; without it the edge is "
              "the center quantized to INT8, which rarely escalates.")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="Single TorchScript file only: tokenizer.json to ship with it.")
@click.option("--labels", default=None, help="Single TorchScript file only: comma-separated "
              "label names (default: output indices).")
@click.option("--calibration", type=click.Path(path_type=Path), default=None,
              help="Single TorchScript file only: labelled JSON Lines split to calibrate on.")
@click.option("--max-length", type=click.IntRange(1, 4096), default=128, show_default=True,
              help="Single TorchScript file only: tokens kept per input.")
@click.option("--input", "declared", multiple=True, metavar="NAME:DATATYPE:SHAPE[:MIN,MAX]",
              help="Single TorchScript file only: a model input its signature does not "
              "describe, e.g. image:FP32:-1,1,28,28 or features:FP32:-1,13 (-1: any size); "
              "repeat for each input, in forward's order. Without --image it is passed "
              "through as a tensor; MIN,MAX (features:FP32:-1,30:-5,5) is the range its "
              "values must lie in (requests outside it are refused).")
@click.option("--image", "image", default=None, metavar="OPTIONS",
              help="Single TorchScript file only: the --input is an image clients send as "
              "JPEG/PNG or pixels; OPTIONS like scale=255,mean=0.1307,std=0.3081 (per "
              "channel: 0.485/0.456/0.406), resize=N (shorter side, then a centre crop), "
              "layout=NCHW|NHWC, max_pixels=N. Use --image '' for the defaults.")
@click.option("--pair", is_flag=True, help="Single TorchScript file only: a text model "
              "taking sentence pairs; clients send text and text_pair, encoded as the "
              "tokenizer encodes pairs (implied by calibration rows with text_pair).")
@click.option("--create", is_flag=True, help="Make the registry home if it is not one yet "
              "(as `registry init`); without it, a folder with no registry is refused.")
@click.option("--output", "output", default=None, metavar="NAME_OR_INDEX",
              help="Single TorchScript file only: the element of the tuple or dict the model "
              "returns that holds the logits (default: the first; a dict's 'logits').")
@json_flag
@pass_ctx
def publish_cmd(ctx: Context, path: Path, name: str, canary: str, waves: str | None,
                min_fidelity: float | None, tolerance: float | None, confidence: float | None,
                force: bool, skip_existing: bool, edge: Path | None, tokenizer: Path | None,
                labels: str | None, calibration: Path | None, max_length: int,
                declared: tuple[str, ...], image: str | None, pair: bool, create: bool,
                output: str | None, as_json: bool, **wave_flags: Any) -> None:
    """Build a release from PATH and record it as the next version of NAME.

    PATH is a release folder with a tiered.json (center TorchScript, edge TorchScript or fp32
    ONNX, labels, labelled calibration split; a tokenizer for text, the inputs and their kind
    for images and tensors) or a single TorchScript file, which is then both the center and,
    quantized to INT8, the edge (or --edge names a smaller edge: a cascade). A text model
    (forward(input_ids, attention_mask[, token_type_ids])) needs no more; any other declares
    its inputs with --input (and --image).
    """
    from registry.publish.signature import image_input
    from registry.publish.source import PAIR, load_source

    check_name(name)
    ctx.create = create
    ctx.check_home()  # a wrong folder is refused before minutes of export and calibration
    settings = ctx.settings
    given = {key: value for key, value in wave_flags.items() if value is not None}
    if given and waves is None:
        raise click.UsageError(f"--{next(iter(given)).replace('_', '-')} applies to --waves only")
    if waves is not None and canary:
        raise click.UsageError("--canary and --waves exclude each other")
    rollout = None if waves is None else wave_policy(settings, waves, given)
    inputs = [parse_input(text) for text in declared] or None
    if image is not None and (inputs is None or len(inputs) != 1):
        raise click.UsageError("--image describes the one --input of an image model")
    request: RequestInput | None = (image_input(inputs[0], image_options(image))
                                    if inputs and image is not None
                                    else ranged_input(declared, image is not None))
    if pair:
        if request is not None:
            raise click.UsageError("--pair is for text models; --image declares an image")
        request = TextInput(max_length=max_length, pair=PAIR)
    source = load_source(path, tokenizer=tokenizer,
                         labels=labels.split(",") if labels else None,
                         calibration=calibration, max_length=max_length, inputs=inputs,
                         request=request, edge=edge, output=output_choice(output))
    # torch and onnxruntime load here only: list/show/audit, and a refused PATH, stay fast
    from registry.publish.pipeline import PublishOptions, publish

    options = PublishOptions(
        name=name, force=force, skip_existing=skip_existing,
        min_fidelity=settings.min_fidelity if min_fidelity is None else min_fidelity,
        tolerance=settings.tolerance if tolerance is None else tolerance,
        confidence=settings.confidence if confidence is None else confidence,
        canary=[n for n in canary.split(",") if n], rollout=rollout)
    result = publish(settings, ctx.catalog, source, options, step=_step)
    emit(as_json, {"created": result.created, "manifest": msgspec.to_builtins(result.manifest),
                   "edge_fp32_size": result.edge_fp32_size, "seconds": result.seconds,
                   "cascade": result.cascade},
         lambda: tables.publish_summary(out, result))


def parse_input(text: str) -> TensorSpec:
    """``NAME:DATATYPE:SHAPE[:MIN,MAX]`` (``image:FP32:-1,1,28,28``) as a model input (the
    range, if any, is the request input's: ``ranged_input``)."""
    parts = text.split(":")
    try:
        name, datatype, shape = parts if len(parts) == 3 else parts[:3] if len(parts) == 4 \
            else ("", "", "x")
        dims = [int(d) for d in shape.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected NAME:DATATYPE:SHAPE[:MIN,MAX], e.g. "
                                 f"image:FP32:-1,1,28,28 or features:FP32:-1,30:-5,5",
                                 param_hint="--input") from None
    if datatype not in NUMERIC or not name.isidentifier() or not 1 <= len(dims) <= 8 or \
            any(d == 0 or d < -1 for d in dims) or dims[0] != -1:
        raise click.BadParameter(f"{text!r}: a Python identifier, a numeric V2 datatype "
                                 f"({', '.join(NUMERIC)}) and a shape whose first dimension "
                                 f"is -1 (the rows)", param_hint="--input")
    return TensorSpec(name, datatype, dims)


def ranged_input(declared: tuple[str, ...], image: bool) -> TensorInput | None:
    """The tensor request input of an ``--input`` that carries a value range (``:MIN,MAX``):
    requests with values outside it are refused (400), as the manifest's range is checked."""
    ranged = [text for text in declared if text.count(":") == 3]
    if not ranged:
        return None
    if image or len(declared) != 1:
        raise click.BadParameter("a value range (:MIN,MAX) is for the one --input of a tensor "
                                 "model (one request input per release)", param_hint="--input")
    text = ranged[0]
    try:
        low, high = (float(v) for v in text.rsplit(":", 1)[1].split(","))
    except ValueError:
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise click.BadParameter(f"{text!r}: the range is MIN,MAX, two finite numbers with MIN "
                                 f"< MAX, e.g. features:FP32:-1,30:-5,5", param_hint="--input")
    return TensorInput(text.split(":", 1)[0], minimum=low, maximum=high)


def output_choice(text: str | None) -> str | int | None:
    """``--output``: digits are an index, anything else a name."""
    return int(text) if text is not None and text.isascii() and text.isdecimal() else text


def image_options(text: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE pairs, comma-separated",
                                 param_hint="--image")
    return {key.strip(): value.strip() for key, value in pairs}


@contextmanager
def _step(name: str) -> Iterator[None]:
    with err.status(f"{name} …"):
        yield
    err.print(f"[green]✓[/] {name}")


@click.command("list")
@json_flag
@pass_ctx
def list_cmd(ctx: Context, as_json: bool) -> None:
    """List models with their latest, production and canary versions."""
    models = ctx.catalog.models()
    emit(as_json, models, lambda: tables.models_table(out, models))


@click.command("show")
@click.argument("ref")
@json_flag
@pass_ctx
def show_cmd(ctx: Context, ref: str, as_json: bool) -> None:
    """Show NAME (all versions) or NAME@VERSION / NAME@ALIAS (its manifest)."""
    name, version = split_ref(ref)
    if version is None:
        rows = ctx.catalog.versions(name)

        def human() -> None:
            tables.versions_table(out, name, rows)
            retire_commands.say_retired(out, ctx, name)  # a retired model says so

        emit(as_json, [tables.version_dict(r) for r in rows], human)
    else:
        row = ctx.catalog.resolve(name, version)
        emit(as_json, tables.version_dict(row, full=True), lambda: tables.version_detail(out, row))


@click.command("pull")
@click.argument("ref")
@click.option("--tier", type=click.Choice(["edge", "center"]), required=True,
              help="Which artifact to materialize: INT8 ONNX (edge) or TorchScript (center).")
@click.option("--store", type=click.Path(path_type=Path), required=True,
              help="Model store folder, e.g. ./var/edge.")
@click.option("--no-activate", is_flag=True, help="Install without pointing CURRENT at it.")
@json_flag
@pass_ctx
def pull_cmd(ctx: Context, ref: str, tier: str, store: Path, no_activate: bool,
             as_json: bool) -> None:
    """Materialize NAME[@VERSION] (default: production) into a tier's model store."""
    name, version = split_ref(ref)
    row = ctx.catalog.resolve(name, version)
    folder = pull(BlobStore(ctx.settings.blobs), row.manifest, "edge" if tier == "edge"
                  else "center", ModelStore(store), activate=not no_activate,
                  raw=row.manifest_bytes or None, signature=row.signature)
    emit(as_json, {"model": name, "version": row.version, "tier": tier, "path": str(folder)},
         lambda: out.print(f"{name} version {row.version} ({tier}) -> {folder}"))


# registered on the ``registry`` group by registry.cli.main
COMMANDS = (publish_cmd, list_cmd, show_cmd, pull_cmd)
