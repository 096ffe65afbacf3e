"""python -m tidepool [options] [TRACE...]: runs the bundled tidepool-replay
with these arguments, adding the bundled traces when no trace is given (with
no arguments at all, that is the README's main job). Its exit status is the
program's."""

import os
import sys

from . import replay_path, traces

# tidepool-replay's options that take a value as the next argument.
_VALUE_OPTIONS = {"--platform", "--threshold", "--growth-slack", "--lag",
                  "--plot", "--perfetto", "--against"}


def _names_a_trace(args):
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in _VALUE_OPTIONS:
            skip = True
        elif a in ("-h", "--help"):
            return True  # nothing to add: the program prints its help
        elif not a.startswith("-") or a == "-":
            return True
    return False


def main(argv):
    try:
        prog = replay_path()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    args = list(argv)
    if not _names_a_trace(args):
        bundled = traces()
        if not bundled:
            print("tidepool: no bundled traces in this package; give a trace "
                  "(tidepool-replay --help)", file=sys.stderr)
            return 2
        args += bundled
    sys.stdout.flush()
    os.execv(prog, [prog] + args)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
