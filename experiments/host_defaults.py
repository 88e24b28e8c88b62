"""`--host-defaults`: host-time and front-end terms of a serving engine one cannot profile, from
published measurements (experiments/data/serving_defaults.json, where every number names its source,
where in it the figure is, and in one line how it was derived), added to a step model that has no
host time of its own. The file is checked whenever it is read (`check_serving_defaults`): a number
without a source is refused, not used.

The flag's default, `auto`, adds the terms of the engine the scheduler reproduces (SCHEDULER_ENGINES:
the vllm scheduler, vLLM's) to T_step tables that price the kernels only (`prices_kernels_only`: no
calibrated host terms, no profiled host, overhead or whole-step term); `none` adds nothing; an ENGINE
adds that engine's terms to any step model without calibrated ones, and refuses one with them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stepcal.core.errors import InputError
from stepcal.core.readers import read_json
from stepcal.experiments.host_defaults_tp import check_tp_block, tp_block_terms, with_tp_terms

if TYPE_CHECKING:    # imported where used: `--help` loads no numpy
    from stepcal.simulator.step_model import HostTerms

DEFAULTS_PATH = Path(__file__).parent / "data" / "serving_defaults.json"
# The engines of the data file, listed here so `--help` reads no file (a test checks they agree).
ENGINE_NAMES = ("vllm", "vllm-async", "sglang", "sglang-no-overlap")
AUTO, NONE = "auto", "none"
# The engine each scheduler reproduces, named explicitly: only vllm's is an engine with published
# terms. sarathi, slo, static and continuous are policies that no engine here is measured as, and the
# sglang engines of the data file have no scheduler of ours.
SCHEDULER_ENGINES = {"vllm": "vllm"}
AUTO_HELP = ("Default auto: where --scheduler names an engine with published terms (vllm) and --step-model is "
             "T_step tables from `stepcal fit` that price the kernels only (no calibrated host terms, no profiled "
             "host, overhead or whole-step term), that engine's terms are added; const:/linear: models and tables "
             "with host time of their own get none. none: add nothing. ")
VALIDATE_AUTO_HELP = ("Default auto: as in `stepcal simulate`, with the measured run's scheduler, for a run "
                      "imported from `vllm bench` or from LLMServingSim's bench (`stepcal import vllm-bench`, `stepcal import "
                      "llmservingsim`: both vLLM servers; a run of another server needs --host-defaults none); a run of `stepcal measure` is served by the torch engine, not "
                      "vLLM, and gets none. none: add nothing. ")
HELP = ("ENGINE: add the host-time and front-end terms of a serving engine from published measurements, for a "
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
        "Above one GPU per instance (simulate's --tp, else the TP its tables were fitted at), vllm adds its "
        "multiprocess executor: 0.05 ms per step, one shared-memory round trip from the engine core to the workers "
        "and back (Ray PR #48860; the queues of vLLM PR #9856), and 0.00003 ms per prompt token, the pickling of a "
        "new request's token ids onto that queue, 1.21 ms / 40k tokens (TensorRT-LLM PR #15134); vllm-async "
        "overlaps both with the GPU and adds nothing. "
        "Every other term (per token, the per-request sigma, per stream; per step, per sequence or the "
        "per-request median where not given) is 0: no source measures it. Sources with links, where in each the figure is, and "
        "each derivation: experiments/data/serving_defaults.json")


SOURCE_KEYS = ("short", "url", "title", "where", "measured", "setup", "figures")
MAX_HOW_DERIVED_CHARS = 200   # `how_derived` is one line: the arithmetic, not the argument (that is `notes`)


def read_serving_defaults(path: Path = DEFAULTS_PATH) -> dict:
    data = read_json(path, "the serving-defaults data file")
    check_serving_defaults(data, path)
    return data


def check_serving_defaults(data: dict, path: Path = DEFAULTS_PATH) -> None:
    """Every default traceable: each source says what it is and where in it the figure is; each term
    of each engine has a number, a one-line derivation, and a source unless it is 0 for want of one.
    InputError naming the file and the entry otherwise."""
    from stepcal.simulator.step_model import HostTerms  # lazy: loads numpy
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
        check_tp_block(path, engine, entry, names, lambda where, term: _check_term(path, where, term, sources))


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


def host_defaults(engine: str, path: Path = DEFAULTS_PATH, tp: int = 1):
    """The HostTerms of `engine` in the data file, with what its `tensor_parallel` block adds at
    `tp` > 1 (experiments.host_defaults_tp); at TP 1 the engine's terms as they are."""
    from stepcal.simulator.step_model import HostTerms  # lazy: loads numpy
    engines = read_serving_defaults(path).get("engines", {})
    if engine not in engines:
        raise InputError(f"--host-defaults {engine!r}: expected one of {sorted(engines)}")
    values = {name: entry["value"] for name, entry in engines[engine]["terms"].items()}
    return HostTerms.from_dict(with_tp_terms(values, tp_block_terms(engines[engine]), tp))


def with_host_defaults(model, engine: str | None, step_model: str, tp: int = 1):
    """`model` with the engine's default host terms (at `tp` GPUs per instance) on top; unchanged
    without an engine."""
    if engine is None:
        return model
    from stepcal.simulator.step_model import HostTermsModel  # lazy: loads numpy
    if isinstance(model, HostTermsModel):
        raise InputError(f"--host-defaults {engine}: --step-model {step_model} already has calibrated host terms; "
                         f"drop --host-defaults, or pass the uncalibrated tables")
    return HostTermsModel(model, host_defaults(engine, tp=tp))


# Each engine term in words, with its unit, for the printed line; in HostTerms' order.
TERM_WORDS = {"per_step_ms": "{:g} ms per step", "per_seq_ms": "{:g} ms per sequence per step",
              "per_token_ms": "{:g} ms per token per step", "per_request_ms": "{:g} ms per request (median)",
              "per_request_sigma": "per-request log-normal sigma {:g}",
              "per_prompt_token_ms": "{:g} ms per prompt token", "per_stream_ms": "{:g} ms per active stream"}


@dataclass(frozen=True)
class AddedHostTerms:
    """The engine terms a command added to its step model: the engine, whether the flag named it
    ("flag") or the default chose it ("auto"), the terms (ms, as HostTerms; the sigma has no unit),
    and the TP degree they are for (its `tensor_parallel` terms included above 1)."""
    engine: str
    source: str
    terms: HostTerms
    tp: int = 1

    def to_dict(self) -> dict:
        """summary.json's `host_defaults` block: every engine term by name (the name carries its unit),
        and `tp` where the terms are a multi-GPU instance's (absent at TP 1, as before TP had terms)."""
        block = {"engine": self.engine, "source": self.source,
                 "terms": {name: getattr(self.terms, name) for name in TERM_WORDS}}
        return block if self.tp == 1 else {**block, "tp": self.tp}

    def describe(self) -> str:
        return describe_host_defaults(self.to_dict())


def describe_host_defaults(block: dict) -> str:
    """A `host_defaults` block (AddedHostTerms.to_dict) in one printed line: the engine, who chose it,
    and its non-zero terms with their units."""
    terms = block["terms"]
    shown = [TERM_WORDS[name].format(value) for name, value in terms.items() if value and name in TERM_WORDS]
    at_tp = f", TP {block['tp']}" if block.get("tp", 1) > 1 else ""
    return (f"host terms: {block['engine']} published defaults ({block['source']}{at_tp}): "
            f"{', '.join(shown) or 'all 0'}")


def added_host_terms(choice: str | None, scheduler: str | None, models, tp: int = 1) -> AddedHostTerms | None:
    """What --host-defaults `choice` adds to `models` (the step models as resolved, none of an engine's
    terms on yet) under `scheduler`, for an instance of `tp` GPUs: an ENGINE as named; under auto, the
    engine SCHEDULER_ENGINES gives the scheduler, where every model prices the kernels only
    (`prices_kernels_only`); None for none, for auto elsewhere, and for a scheduler of no engine
    (None: the run's server is not known)."""
    if choice is None or choice == NONE:
        return None
    if choice != AUTO:
        return AddedHostTerms(choice, "flag", host_defaults(choice, tp=tp), tp)
    engine = SCHEDULER_ENGINES.get(scheduler)
    if engine is None or not all(prices_kernels_only(model) for model in models):
        return None
    return AddedHostTerms(engine, "auto", host_defaults(engine, tp=tp), tp)


def prices_kernels_only(model) -> bool:
    """Whether `model` is T_step tables from `stepcal fit` with no host time of their own: not under
    calibrated host terms, and no term that holds the engine's host time (a profiled `host` or
    `overhead` term, or a whole-step `step` term fitted to measured steps, which holds every part).
    const:/linear: models are not: they are synthetic what-if models, which auto leaves as given."""
    from stepcal.costmodel.tables import TableStepModel  # lazy: loads numpy, pandas
    from stepcal.experiments.validation.split import PART_OF_TERM  # lazy: loads numpy
    if not isinstance(model, TableStepModel):
        return False
    return not any(PART_OF_TERM.get(name) in ("host", "whole_step") for name in model.meta.t_step_terms)


def has_calibrated_terms(step_model: str) -> bool:
    """Whether a step-model directory carries calibrated host terms (meta.json's `host_terms`, as
    experiments.step_models reads them), found without loading its tables."""
    meta = Path(step_model) / "meta.json"
    if not meta.is_file():
        return False
    from stepcal.experiments.step_model_meta import read_step_model_meta  # lazy: loads numpy
    return bool(read_step_model_meta(meta.parent).host_terms)


def add_host_defaults_flag(parser, auto_help: str = AUTO_HELP) -> None:
    """--host-defaults auto|none|ENGINE, auto by default; `auto_help` says what auto does for the command."""
    choices = (AUTO, NONE, *ENGINE_NAMES)
    parser.add_argument("--host-defaults", choices=choices, default=AUTO, metavar="ENGINE",
                        help=f"{auto_help}{HELP} (choices: {', '.join(choices)})")
