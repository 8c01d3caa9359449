"""The variants of train_rounds.py's rounds, as --variants names them: a
train_bench.py variant, optionally with environment settings for its process."""
import re

ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*\Z")


def split_variant(spec):
    """A variant as --variants takes it: train_bench.py's variant, optionally
    followed by ':' and comma-separated environment assignments for its process
    (``emm-pool:EMM_POOL_WAIT_PARKED=0,EMM_POOL_THREAD_CACHE=64M``), so that two
    settings of one allocator run as two variants of the same rounds. Returns
    (train_bench.py's variant, {name: value}); a malformed assignment is a
    ValueError naming it."""
    bench, _, assigns = spec.partition(":")
    env = {}
    for a in filter(None, assigns.split(",")):
        name, eq, value = a.partition("=")
        if not eq or not ENV_NAME.match(name) or any(c.isspace() for c in value):
            raise ValueError(f"variant {spec!r}: {a!r} is not NAME=VALUE with an environment variable's name "
                             "and a value without spaces (the logs split on them)")
        env[name] = value
    if not bench or (":" in spec and not env):
        raise ValueError(f"variant {spec!r}: expected VARIANT or VARIANT:NAME=VALUE[,NAME=VALUE...]")
    return bench, env


def is_peer(variant):
    """Whether `variant` (as --variants names it, settings and all) is one of
    PyTorch's own allocators, the peers emm's variants are compared with."""
    return split_variant(variant)[0] in ("native", "expandable")
