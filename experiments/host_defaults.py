"""`--host-defaults ENGINE`: host-time and front-end terms of a serving engine one cannot profile,
from published measurements (experiments/data/serving_defaults.json, where every number names its
source and derivation), added to a step model that has no calibrated host terms."""
from __future__ import annotations

from pathlib import Path

from simulator.errors import InputError

DEFAULTS_PATH = Path(__file__).parent / "data" / "serving_defaults.json"
# The engines of the data file, listed here so `--help` reads no file (a test checks they agree).
ENGINE_NAMES = ("vllm", "vllm-async")
HELP = ("add the host-time and front-end terms of a serving engine from published measurements, for a "
        "step model without calibrated host terms (one that has them is refused: calibrated terms win). "
        "vllm: V1 engine, synchronous scheduling; vllm-async: with --async-scheduling. Sources: vLLM issue "
        "#10634 and PR #11133 (step gap per sequence), Luo 2026 MI300X study and vLLM PR #51281 "
        "(tokenisation and detokenizer priming per prompt token); terms no source measures are 0. Numbers, "
        "sources and derivations: experiments/data/serving_defaults.json")


def read_serving_defaults(path: Path = DEFAULTS_PATH) -> dict:
    from simulator.readers import read_json
    return read_json(path, "the serving-defaults data file")


def host_defaults(engine: str, path: Path = DEFAULTS_PATH):
    """The HostTerms of `engine` in the data file."""
    from simulator.step_model import HostTerms
    engines = read_serving_defaults(path).get("engines", {})
    if engine not in engines:
        raise InputError(f"--host-defaults {engine!r}: expected one of {sorted(engines)}")
    terms = engines[engine]["terms"]
    return HostTerms.from_dict({name: entry["value"] for name, entry in terms.items()})


def with_host_defaults(model, engine: str | None, step_model: str):
    """`model` with the engine's default host terms on top; unchanged without an engine."""
    if engine is None:
        return model
    from simulator.step_model import HostTermsModel
    if isinstance(model, HostTermsModel):
        raise InputError(f"--host-defaults {engine}: --step-model {step_model} already has calibrated host terms; "
                         f"drop --host-defaults, or pass the uncalibrated tables")
    return HostTermsModel(model, host_defaults(engine))


def has_calibrated_terms(step_model: str) -> bool:
    """Whether a step-model directory carries calibrated host terms (meta.json's `host_terms`, as
    experiments.step_models reads them), found without loading its tables."""
    meta = Path(step_model) / "meta.json"
    if not meta.is_file():
        return False
    from simulator.readers import read_json
    return bool(read_json(meta, "the meta.json of a step-model directory").get("host_terms"))


def add_host_defaults_flag(parser) -> None:
    parser.add_argument("--host-defaults", choices=ENGINE_NAMES, default=None, metavar="ENGINE",
                        help=f"{HELP} (choices: {', '.join(ENGINE_NAMES)})")
