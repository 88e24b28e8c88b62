"""The compact generator spec of the CLI, e.g.

    poisson:rate=5,n=1000,prompt=lognormal:512:1.0,output=uniform:16:256,seed=0

Grammar (explained for users in `stepcal trace generate --help`):
    SPEC    := PROCESS ":" PARAM ("," PARAM)*
    PROCESS := poisson | gamma | onoff
    PARAM   := rate=RPS | cv=X | on=SECONDS | off=SECONDS | n=INT | duration=SECONDS
             | seed=INT | prompt=DIST | output=DIST | lengths=empirical:PATH
             | system=TOKENS[:COUNT] | turns=DIST | think=SECONDS | loop=closed|open
    DIST    := fixed:N | uniform:LO:HI | lognormal:MEAN:SIGMA[:MAX] | empirical:PATH
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from stepcal.core.bounds import (
    MAX_ARRIVAL_S,
    MAX_GAMMA_CV,
    MAX_LOGNORMAL_SIGMA,
    MAX_RATE_RPS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_TOKENS_PER_REQUEST,
    MAX_TURNS_PER_SESSION,
    MIN_GAMMA_CV,
    MIN_RATE_RPS,
)
from stepcal.core.errors import InputError
from stepcal.core.workload.generators import (
    Empirical,
    Fixed,
    Gamma,
    LogNormal,
    OnOff,
    Poisson,
    Uniform,
    WorkloadSpec,
)
from stepcal.core.workload.sessions import SessionShape, SharedSystem

PROCESSES = ("poisson", "gamma", "onoff")
COMMON_KEYS = ("rate", "n", "duration", "seed", "prompt", "output", "lengths", "system", "turns", "think", "loop")
PROCESS_KEYS = {"poisson": (), "gamma": ("cv",), "onoff": ("on", "off")}

@dataclass(frozen=True)
class PartialSpec:
    """A parsed spec whose rate or size may still come from command-line flags."""
    process: str
    params: dict                 # key -> parsed value, only those written in the spec
    text: str

    def complete(self, *, rate_rps=None, num_requests=None, duration_s=None, seed=None,
                 label: str = "generator spec") -> WorkloadSpec:
        """Fill what the spec left out from the flags (`rate_rps` overrides rate=) and build it."""
        p = dict(self.params)
        if rate_rps is not None:
            p["rate"] = _rate(str(rate_rps), "--rate")
        if num_requests is not None and "n" not in p and "duration" not in p:
            p["n"] = num_requests
        if duration_s is not None and "n" not in p and "duration" not in p:
            p["duration"] = duration_s
        if seed is not None and "seed" not in p:
            p["seed"] = seed
        return _build(self.process, p, self.text, label)


def looks_like_spec(text: str) -> bool:
    return text.split(":", 1)[0].strip().lower() in PROCESSES and ":" in text


def parse_spec(text: str, label: str = "generator spec") -> PartialSpec:
    """Parse the spec's syntax and values; say which piece is wrong."""
    head, sep, body = text.partition(":")
    process = head.strip().lower()
    if not sep or process not in PROCESSES:
        raise InputError(f"{label} {text!r}: must start with one of {', '.join(PROCESSES)} "
                         f"followed by ':' (e.g. poisson:rate=5,n=1000,...)")
    allowed = COMMON_KEYS + PROCESS_KEYS[process]
    params: dict = {}
    for piece in _pieces(body):
        key, eq, value = piece.partition("=")
        key, value = key.strip().lower(), value.strip()
        where = f"{label} {text!r}: {piece!r}"
        if not eq or not value:
            raise InputError(f"{where}: expected KEY=VALUE")
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r} for {process} "
                             f"(keys: {', '.join(allowed)})")
        if key in params or (key == "lengths" and ({"prompt", "output"} & params.keys())) \
                or (key in ("prompt", "output") and "lengths" in params):
            raise InputError(f"{where}: {key} is given twice (lengths= sets both prompt and output)")
        params[key] = _VALUE_PARSERS[key](value, where)
    return PartialSpec(process, params, text)


def _pieces(body: str) -> list[str]:
    # After an empirical file path, a piece without '=' continues the path (it had a comma).
    pieces: list[str] = []
    for raw in body.split(","):
        continues_path = pieces and "=empirical:" in pieces[-1].replace(" ", "").lower()
        if continues_path and "=" not in raw and raw.strip():
            pieces[-1] += "," + raw
        elif raw.strip():
            pieces.append(raw)
    return pieces


def _build(process: str, p: dict, text: str, label: str) -> WorkloadSpec:
    def need(key, hint):
        if key not in p:
            raise InputError(f"{label} {text!r}: {key}= is missing ({hint})")
        return p[key]
    rate = need("rate", "requests per second, e.g. rate=5")
    if process == "poisson":
        arrivals = Poisson(rate)
    elif process == "gamma":
        arrivals = Gamma(rate, need("cv", "CV of inter-arrival times, e.g. cv=3"))
    else:
        arrivals = OnOff(rate, need("on", "seconds on, e.g. on=10"), need("off", "seconds off, e.g. off=30"))
    if "n" not in p and "duration" not in p:
        raise InputError(f"{label} {text!r}: give its size, n=REQUESTS or duration=SECONDS")
    if "n" not in p and rate * p["duration"] > MAX_REQUESTS:
        raise InputError(f"{label} {text!r}: rate x duration asks for ~{rate * p['duration']:.3g} requests; "
                         f"at most {MAX_REQUESTS:,} (core.bounds)")
    if p.get("duration", 0.0) > MAX_ARRIVAL_S:   # after the request count, the likelier mistake
        raise InputError(f"{label} {text!r}: duration={p['duration']:g} s is past a year "
                         f"({MAX_ARRIVAL_S:g} s, MAX_ARRIVAL_S, core.bounds)")
    if "lengths" in p:
        prompt = output = p["lengths"]
    else:
        prompt = need("prompt", "e.g. prompt=lognormal:512:1.0")
        output = need("output", "e.g. output=uniform:16:256")
    sessions = None
    if "turns" in p:
        sessions = SessionShape(p["turns"], p.get("think", 0.0), p.get("loop", "closed") == "closed")
    elif "think" in p or "loop" in p:
        raise InputError(f"{label} {text!r}: think= and loop= shape multi-turn sessions: give turns=DIST too")
    system = SharedSystem(*p["system"]) if "system" in p else None
    return WorkloadSpec(arrivals, prompt, output, num_requests=p.get("n"),
                        duration_s=p.get("duration"), seed=p.get("seed", 0), text=text,
                        system=system, sessions=sessions)


# ---- values ----

def _bounded(minimum: float, maximum: float, *, allow_minimum: bool = False, why: str = "core.bounds"):
    """A parser of a float in (minimum, maximum] ([minimum, maximum] with allow_minimum); `why` says whence the range."""
    def parse(value: str, where: str) -> float:
        try:
            number = float(value) + 0.0    # -0 as 0: numpy refuses a sigma of -0.0 as negative
        except ValueError:
            number = float("nan")
        low_ok = number >= minimum if allow_minimum else number > minimum
        if not (low_ok and number <= maximum):    # NaN fails both
            kind = "a non-negative number" if allow_minimum and minimum == 0 else "a positive number"
            low = f"from {minimum:.3g} " if minimum > 0 else ""
            bound = f"; the range is {low}up to {maximum:g} ({why})" if maximum < sys.float_info.max else ""
            raise InputError(f"{where}: must be {kind}, got {value!r}{bound}")
        return number
    return parse


_rate = _bounded(MIN_RATE_RPS, MAX_RATE_RPS, allow_minimum=True, why="requests per second, core.bounds")
_mean_tokens = _bounded(0.0, MAX_TOKENS_PER_REQUEST, why="tokens, MAX_TOKENS_PER_REQUEST, core.bounds")
_seconds = _bounded(0.0, MAX_ARRIVAL_S, why="a year at most, core.bounds")
_non_negative_seconds = _bounded(0.0, MAX_ARRIVAL_S, allow_minimum=True, why="a year at most, core.bounds")
_sigma = _bounded(0.0, MAX_LOGNORMAL_SIGMA, allow_minimum=True,
                  why="sigma of the underlying normal; past 3 the clamp to [1, MAX] swallows most lengths, "
                      "core.bounds")


def _int(value: str, where: str, minimum: int, maximum: int = MAX_TOKENS_PER_REQUEST) -> int:
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not minimum <= number <= maximum:
        kind = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise InputError(f"{where}: must be {kind} up to {maximum:,} (core.bounds), got {value!r}")
    return number


def _distribution(value: str, where: str):
    name, _, rest = value.partition(":")
    name = name.strip().lower()
    if name == "empirical":
        if not rest.strip():
            raise InputError(f"{where}: empirical needs a file, e.g. empirical:conv.csv")
        return Empirical(rest.strip())
    args = rest.split(":") if rest else []
    shapes = {"fixed": ("N",), "uniform": ("LO", "HI"), "lognormal": ("MEAN", "SIGMA", "[MAX]")}
    if name not in shapes:
        raise InputError(f"{where}: unknown length distribution {name!r} "
                         f"(fixed:N, uniform:LO:HI, lognormal:MEAN:SIGMA[:MAX], empirical:PATH)")
    required = [a for a in shapes[name] if not a.startswith("[")]
    if not len(required) <= len(args) <= len(shapes[name]):
        raise InputError(f"{where}: {name} takes {':'.join(shapes[name])}, got {value!r}")
    if name == "fixed":
        return Fixed(_int(args[0], where, 1))
    if name == "uniform":
        lo, hi = _int(args[0], where, 1), _int(args[1], where, 1)
        if lo > hi:
            raise InputError(f"{where}: uniform needs LO <= HI, got {lo} > {hi}")
        return Uniform(lo, hi)
    maximum = _int(args[2], where, 1) if len(args) == 3 else None
    return LogNormal(_mean_tokens(args[0], where), _sigma(args[1], where), maximum)


def _empirical_only(value: str, where: str):
    dist = _distribution(value, where)
    if not isinstance(dist, Empirical):
        raise InputError(f"{where}: lengths= takes empirical:PATH; use prompt= and output= otherwise")
    return dist


def _system(value: str, where: str) -> tuple[int, int]:
    tokens, _, count = value.partition(":")
    return _int(tokens, where, 1), (_int(count, where, 1, 1_000_000) if count else 1)


def _turns(value: str, where: str):
    dist = _distribution(value, where)
    if not isinstance(dist, (Fixed, Uniform)):
        raise InputError(f"{where}: turns= takes fixed:N or uniform:LO:HI")
    if (dist.num_tokens if isinstance(dist, Fixed) else dist.hi) > MAX_TURNS_PER_SESSION:
        raise InputError(f"{where}: at most {MAX_TURNS_PER_SESSION:,} turns per session (core.bounds)")
    return dist


def _loop(value: str, where: str) -> str:
    if value.lower() not in ("closed", "open"):
        raise InputError(f"{where}: loop= is closed (a turn is sent a think time after the previous answer) "
                         f"or open (a think time after the previous turn was sent)")
    return value.lower()


_VALUE_PARSERS = {
    "rate": _rate,
    "cv": _bounded(MIN_GAMMA_CV, MAX_GAMMA_CV, allow_minimum=True, why="CV of the gaps, core.bounds"),
    "on": _seconds, "off": _non_negative_seconds, "duration": _bounded(0.0, sys.float_info.max),   # bounded in _build
    "n": lambda v, w: _int(v, w, 1, MAX_REQUESTS), "seed": lambda v, w: _int(v, w, 0, MAX_SEED),
    "prompt": _distribution, "output": _distribution, "lengths": _empirical_only,
    "system": _system, "turns": _turns, "think": _non_negative_seconds, "loop": _loop,
}
