"""Run ``contractgen ARGS...`` and dump every thread's Python stack to stderr every ``EVERY``
seconds (first argument): where a long GPU run spends its time when it prints nothing, without
a profiler on the lent machine.

    python3 benchmarks/with_stacks.py 45 parity --device cuda --model Qwen3-0.6B ...
"""

import faulthandler
import sys

from contractgen.cli import main

if __name__ == "__main__":
    every, *args = sys.argv[1:]
    faulthandler.dump_traceback_later(float(every), repeat=True)
    sys.argv = ["contractgen", *args]
    sys.exit(main())
