"""`--host-defaults ENGINE`: host-time and front-end terms of a serving engine one cannot profile,
from published measurements (experiments/data/serving_defaults.json, where every number names its
source, where in it the figure is, and in one line how it was derived), added to a step model that
has no calibrated host terms. The file is checked whenever it is read (`check_serving_defaults`):
a number without a source is refused, not used."""
from __future__ import annotations

from pathlib import Path

from stepcal.core.errors import InputError

DEFAULTS_PATH = Path(__file__).parent / "data" / "serving_defaults.json"
# The engines of the data file, listed here so `--help` reads no file (a test checks they agree).
ENGINE_NAMES = ("vllm", "vllm-async", "sglang", "sglang-no-overlap")
HELP = ("add the host-time and front-end terms of a serving engine from published measurements, for a "
        "step model without calibrated host terms (one that has them is refused: calibrated terms win). "
        "vllm (V1 engine, synchronous scheduling): 0.012 ms per sequence per step = (5.5 - 2.5) ms / 256 "
        "sequences, from the decode-step gap in vLLM issue #10634 (cross-checked by simllm PR #204); "
        "0.0028 ms per prompt token = tokenisation 220 ms / 100k tokens (Luo 2026 (MI300X CPU-GPU co-design "
        "blog)) + detokenizer priming 12 ms / 20k tokens (vLLM PR #51281; cross-check vLLM PR #57330); "
        "13.5 ms per request, the midpoint of the 12-15 ms of front-end preprocessing per request measured in "
        "vLLM PR #21139 (cross-check BLIS fitted coefficients: 15.6 ms on H100). "
        "vllm-async (--async-scheduling): 0.000625 ms per sequence per step = 0.160 ms / 256, from vLLM PR "
        "#11133; the same 0.0028 ms per prompt token and 13.5 ms per request. "
        "sglang (overlap scheduler, its default): 0.0022 ms per prompt token, the tokenisation part alone "
        "(Luo 2026 (MI300X CPU-GPU co-design blog)); no step term, its host work hidden behind the GPU (SGLang "
        "v0.4 blog). sglang-no-overlap: 0.61 ms per step = 16 / 3053.86 - 16 / 3458.31 tok/s, overlap off vs on "
        "(SGLang PR #5608; cross-check SGLang PR #38131, 0.74 ms), and the same 0.0022 ms per prompt token. "
        "Every other term (per token, the per-request sigma, per stream; per step, per sequence or the "
        "per-request median where not given) is 0: no source measures it. Sources with links, where in each the figure is, and "
        "each derivation: experiments/data/serving_defaults.json")


SOURCE_KEYS = ("short", "url", "title", "where", "measured", "setup", "figures")
MAX_HOW_DERIVED_CHARS = 200   # `how_derived` is one line: the arithmetic, not the argument (that is `notes`)


def read_serving_defaults(path: Path = DEFAULTS_PATH) -> dict:
    from stepcal.core.readers import read_json
    data = read_json(path, "the serving-defaults data file")
    check_serving_defaults(data, path)
    return data


def check_serving_defaults(data: dict, path: Path = DEFAULTS_PATH) -> None:
    """Every default traceable: each source says what it is and where in it the figure is; each term
    of each engine has a number, a one-line derivation, and a source unless it is 0 for want of one.
    InputError naming the file and the entry otherwise."""
    from stepcal.simulator.step_model import HostTerms
    sources = data.get("sources")
    engines = data.get("engines")
    if not isinstance(sources, dict) or not isinstance(engines, dict) or not engines:
        raise InputError(f"{path}: expected objects `sources` and `engines`")
    for key, source in sources.items():
        missing = [k for k in SOURCE_KEYS if not (isinstance(source, dict) and source.get(k))]
        if missing:
            raise InputError(f"{path}: sources.{key}: missing {', '.join(missing)}")
        if not source["url"].startswith("https://"):
            raise InputError(f"{path}: sources.{key}.url must be an https:// link, got {source['url']!r}")
    names = HostTerms.engine_names()
    for engine, entry in engines.items():
        terms = entry.get("terms") if isinstance(entry, dict) else None
        if not isinstance(terms, dict) or set(terms) != names:
            raise InputError(f"{path}: engines.{engine}.terms must give each of {', '.join(sorted(names))}")
        for name, term in terms.items():
            _check_term(path, f"engines.{engine}.terms.{name}", term, sources)


def _check_term(path: Path, where: str, term: dict, sources: dict) -> None:
    value, cited, how = term.get("value"), term.get("sources"), term.get("how_derived")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InputError(f"{path}: {where}.value must be a number >= 0, got {value!r}")
    if not isinstance(cited, list) or any(c not in sources for c in cited):
        raise InputError(f"{path}: {where}.sources must list keys of `sources`, got {cited!r}")
    if not isinstance(how, str) or not how.strip() or "\n" in how or len(how) > MAX_HOW_DERIVED_CHARS:
        raise InputError(f"{path}: {where}.how_derived must be one line of at most {MAX_HOW_DERIVED_CHARS} "
                         f"characters saying how the number was derived")
    if value != 0 and not cited:
        raise InputError(f"{path}: {where}: the value {value} cites no source; every default must name the "
                         f"published measurement it comes from")
    if value == 0 and "left 0" not in how:
        raise InputError(f"{path}: {where}: a term left 0 must say so and why in how_derived ('left 0: ...')")


def host_defaults(engine: str, path: Path = DEFAULTS_PATH):
    """The HostTerms of `engine` in the data file."""
    from stepcal.simulator.step_model import HostTerms
    engines = read_serving_defaults(path).get("engines", {})
    if engine not in engines:
        raise InputError(f"--host-defaults {engine!r}: expected one of {sorted(engines)}")
    terms = engines[engine]["terms"]
    return HostTerms.from_dict({name: entry["value"] for name, entry in terms.items()})


def with_host_defaults(model, engine: str | None, step_model: str):
    """`model` with the engine's default host terms on top; unchanged without an engine."""
    if engine is None:
        return model
    from stepcal.simulator.step_model import HostTermsModel
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
    from stepcal.core.readers import read_json
    return bool(read_json(meta, "the meta.json of a step-model directory").get("host_terms"))


def add_host_defaults_flag(parser) -> None:
    parser.add_argument("--host-defaults", choices=ENGINE_NAMES, default=None, metavar="ENGINE",
                        help=f"{HELP} (choices: {', '.join(ENGINE_NAMES)})")
