"""``geotrain export RUN_DIR OUT_DIR``: a finished job's final model as files others load.

For a Hugging Face model (``model.hf_config`` / ``hf_pretrained``) ``OUT_DIR``
becomes a directory ``transformers`` loads as it is::

    AutoModelForCausalLM.from_pretrained(OUT_DIR)
    AutoTokenizer.from_pretrained(OUT_DIR)

(``config.json``, ``model.safetensors``, the tokenizer files and a
``generation_config.json`` where the model has one). For the reference GPT it
holds ``model.safetensors`` and ``geotrain_model.json``
(``geotrain.models.export.load_gpt_export(OUT_DIR)`` loads it). ``RUN_DIR`` is
the job's report directory (``runs/<job id>``); ``[report] export = true``
exports into ``RUN_DIR/export`` when the job ends.
"""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a finished job's model as a Hugging Face directory",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the job's report directory (runs/<job id>)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the exported model goes (created)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.coordinator.artifacts import export_run, read_run

    job, _, meta = read_run(args.run_dir)
    out = export_run(args.run_dir, args.out_dir)
    print(json.dumps({"event": "export", "path": str(out), "step": meta.get("step"), "round": meta.get("round"),
                      "model": "hf" if job.model.is_hf else "gpt" if job.model.loader is None else "loader"}))
    return 0
