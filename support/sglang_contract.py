"""Run inside a side environment (support/sglang_env.py): judge /generate bodies with SGLang's
own code, exactly as its HTTP server does. Reads one JSON body per line on stdin and writes one
JSON verdict per line: ``request_error`` from ``GenerateReqInput(**body)
.normalize_batch_and_arguments()`` (every release), ``contract_error`` from the JSON contract
gate of 0.5.22 and later (``generate_contract_error``; absent before), each null when accepted.
"""

from __future__ import annotations

import json
import sys
import warnings


def main() -> None:
    warnings.filterwarnings("ignore")  # SGLang warns at import about GPU-only kernels
    from sglang.srt.managers.io_struct import GenerateReqInput
    try:
        from sglang.srt.entrypoints.api_contract import generate_contract_error
    except ImportError:  # before 0.5.22: no contract gate
        generate_contract_error = None
    for line in sys.stdin:
        body = json.loads(line)
        try:
            GenerateReqInput(**body).normalize_batch_and_arguments()
            request_error = None
        except Exception as e:  # what SGLang's server answers with
            request_error = f"{type(e).__name__}: {e}"
        verdict = {"request_error": request_error, "has_contract_gate": generate_contract_error is not None,
                   "contract_error": generate_contract_error(body) if generate_contract_error else None}
        print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
