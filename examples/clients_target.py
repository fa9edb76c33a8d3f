"""A tiny target and drafter for `examples/clients_check.sh`: the scripted agent model
of examples/scripted_agent.py (Qwen3's tokenizer and template, a 64K context), which
thinks, calls the given tool when the request declares tools, and answers "It is
sunny." once the tool's result is back (or, with --then, makes a second call).

    python examples/clients_target.py OUT --call Read '{"file_path": "/x/hello.txt"}'

writes OUT/target and OUT/draft (a random DFlash drafter), for
`dflash-mlx serve --model OUT/target --draft OUT/draft`.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from random_pair import make_draft  # noqa: E402
from scripted_agent import make_scripted_target  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder for target/ and draft/")
    p.add_argument(
        "--call",
        nargs=2,
        metavar=("NAME", "ARGUMENTS"),
        default=["get_weather", '{"city": "Paris"}'],
        help="the tool call the model makes: a name and a JSON object",
    )
    p.add_argument(
        "--then",
        nargs=2,
        metavar=("NAME", "ARGUMENTS"),
        help="a second call, made once the first one's result is back",
    )
    p.add_argument("--style", choices=["qwen3", "qwen3_5"], default="qwen3")
    p.add_argument("--context", type=int, default=65536)
    args = p.parse_args()
    call = (args.call[0], json.loads(args.call[1]))
    then = args.then and (args.then[0], json.loads(args.then[1]))
    target = make_scripted_target(
        args.out / "target", args.style, call, args.context, then
    )
    make_draft(args.out / "draft", target, layers=1)  # the target's context
    print(target, args.out / "draft")


if __name__ == "__main__":
    main()
