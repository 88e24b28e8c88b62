"""Speculative decoding flags (simulate): the method and drafts, the acceptance model, the drafter's cost.

Loads only argparse: the library is imported inside the functions that build settings.
"""
from __future__ import annotations

import argparse

from stepcal.core.errors import InputError
from stepcal.experiments.commands import argtypes
from stepcal.simulator.spec_decode import parse_spec_decode

SPEC_METHODS = ("draft-model", "eagle", "mtp", "ngram")   # simulator.spec_decode.METHODS (a test checks they agree)


def add_spec_decode_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("speculative decoding (vllm and sarathi schedulers)")
    g.add_argument("--spec-decode", default=None, metavar="METHOD:K",
                   help=f"speculative decoding as vLLM V1 schedules it, METHOD one of {', '.join(SPEC_METHODS)}: "
                        "each decoding request verifies K drafts a step (1 + K tokens of the token budget; "
                        "drafts trimmed when the budget or the KV cache runs short), K lookahead KV slots are "
                        "reserved (none for ngram), rejected drafts roll back, the step emits the accepted "
                        "drafts and one more token. K is 1 to 128 (vLLM's rejection sampler's limit)")
    g.add_argument("--acceptance", default=None, metavar="SPEC",
                   help="how many drafts pass, drawn per request and step (needed with --spec-decode): "
                        "rates:P1,P2,... conditional acceptance rate of each draft position (in [0, 1], not "
                        "rising; later positions take the last); mean:AL, a mean acceptance length "
                        "(1 + accepted drafts per step, in [1, K + 1]) as one rate for every position; or "
                        "trace:FILE, each request's accepted counts replayed round by round (CSV with columns "
                        "request_id and accepted, the counts separated by spaces; every request of the trace "
                        "must have a row); or counters:FILE, rates fitted to a measured run's counters (JSON "
                        "with vLLM's num_drafts and num_accepted_tokens_per_pos, at the top or under "
                        "spec_decode as in summary.json; rates that rise with position are pooled)")
    g.add_argument("--drafter", default=None, metavar="SPEC",
                   help="the drafter's time, added to every step: head:LAYERS[,VOCAB] (EAGLE head or MTP layers "
                        "composed from the target's tables: LAYERS of its layers and an LM head over VOCAB "
                        "tokens, default the target's), const:MS, or a draft model's T_step table directory "
                        "(K passes: one over the step's tokens, then one token per sequence). Default: head:1 "
                        "for eagle and mtp, const:0 for ngram; draft-model needs its tables")
    g.add_argument("--spec-seed", type=argtypes.seed, default=0, help="seed of the acceptance draws (default 0)")


def spec_decode_from_args(args):
    """The SpecDecodeConfig of the flags, None without --spec-decode (an InputError naming a bad flag)."""
    text = getattr(args, "spec_decode", None)
    if text is None:
        for flag in ("acceptance", "drafter"):
            if getattr(args, flag, None) is not None:
                raise InputError(f"--{flag} needs --spec-decode")
        return None
    if args.scheduler not in ("vllm", "sarathi"):
        raise InputError(f"--spec-decode: the {args.scheduler} scheduler has no speculative decoding; "
                         f"use --scheduler vllm or sarathi")
    return parse_spec_decode(text, args.acceptance, args.spec_seed)


def drafted_model_from_args(args, model, spec_decode):
    """`model` with the drafter's time (and the verify step's attention tiles) added; `model` itself
    when spec decode is off."""
    if spec_decode is None:
        return model
    if getattr(args, "ranges", 0):
        raise InputError("--ranges: the replications do not draw the drafter's time yet; leave out --spec-decode "
                         "or --ranges")
    from stepcal.costmodel.spec_decode import drafted_step_model  # lazy: loads numpy, pandas
    from stepcal.experiments.step_models import resolve_step_model  # lazy: loads numpy
    return drafted_step_model(model, spec_decode, args.drafter, resolve_step_model)
