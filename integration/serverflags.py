"""Which vLLM server flags a list of server arguments sets, read the way vLLM's own parser reads them.

vLLM's FlexibleArgumentParser (0.26 and 0.32) is argparse with abbreviations on, and no flag or
variable turns them off. It takes the last value of a flag given twice; any prefix of a long flag
that no other flag shares (`--hos` is `--host`, `--max-model` is `--max-model-len`); a one-letter
flag with its value attached (`-qfp8`); `_` for `-` in a name (`--max_model_len`); `--flag.key=v` for
a JSON flag; and `-O3` for `--optimization-level 3`. A flag here is matched by every spelling vLLM
could take for it (tests/integration/test_serverflags.py checks this against the installed vLLM's
parser).
"""

from __future__ import annotations

from collections.abc import Sequence

LISTEN_FLAGS = ("--host", "--port")  # where a server listens: the kit's alone (127.0.0.1, a free port)
# the other names vLLM's parser gives a flag (its aliases and --no- forms, in 0.32; 0.26 has no more)
ALIASES = {"--compilation-config": ("-cc",), "--enforce-eager": ("--no-enforce-eager",),
           "--gpu-memory-utilization": ("--device-memory-utilization",), "--quantization": ("-q",),
           "--skip-tokenizer-init": ("--no-skip-tokenizer-init",), "--tensor-parallel-size": ("-tp",)}


def flag_name(word: str) -> str | None:
    """The flag a server argument names as vLLM reads it (`--max_model_len=8` -> `--max-model-len`,
    `--compilation-config.mode=3` -> `--compilation-config`, `-O3` -> `-O`); None for a value."""
    if word.startswith("--"):
        name = word.split("=", 1)[0][2:].split(".", 1)[0]
        return "--" + name.replace("_", "-") if name else None  # `--` alone ends the flags
    if word.startswith("-O"):
        return "-O"
    if len(word) > 1 and word[0] == "-" and word[1].isalpha():
        return word.split("=", 1)[0]
    return None  # a value, a negative number among them


def reads_as(word: str, flag: str) -> bool:
    """Whether vLLM could read `word` as `flag`: the flag itself, a prefix of it (argparse takes one
    that no other flag shares and refuses one that several share), or a one-letter flag with its
    value attached."""
    name = flag_name(word)
    if name is None or name.startswith("--") != flag.startswith("--"):
        return False
    return flag.startswith(name) or (len(flag) == 2 and name.startswith(flag))


def setting(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The words of `args` that vLLM could read as one of `flags` or one of their ALIASES."""
    spelled = [s for f in flags for s in (f, *ALIASES.get(f, ()))]
    return [a for a in args if any(reads_as(a, s) for s in spelled)]


def check_listen_address(args: Sequence[str], where: str) -> None:
    """ValueError naming `where` when `args` could set where a server listens (--host or --port, in
    any spelling vLLM takes), whatever else a run allows."""
    found = setting(args, LISTEN_FLAGS)
    if found:
        raise ValueError(f"{where} {' '.join(found)}: sets where the server listens (--host or --port, "
                         "which vLLM also takes abbreviated); servers listen on 127.0.0.1 only, at a port "
                         "the kit picks, and no flag allows otherwise")
