#!/usr/bin/env python3
"""Writes a neutral importance matrix (every weight 1) for the 2-D weights of a GGUF model, in the GGUF imatrix
format llama-quantize reads (--imatrix): per weight tensor NAME, NAME.in_sum2 (f32, one value per input column)
and NAME.counts (f32, the number of calls, 1), with the imatrix.datasets / chunk_count / chunk_size keys.

  make_imatrix.py GGUF_PY_DIR MODEL.gguf OUT.imatrix.gguf [NAME_REGEX]

NAME_REGEX (Python re.search) limits the entries to the matching tensors: llama-quantize quantizes the others
without weights, i.e. with each type's reference rounding.

llama-quantize refuses IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M without an importance matrix; all-ones weights make
its search minimise the plain squared error, as it does for the other types without one.
"""
import re
import sys

import numpy as np


def main():
    gguf_py, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
    only = re.compile(sys.argv[4]) if len(sys.argv) > 4 else None
    sys.path.insert(0, gguf_py)
    import gguf

    w = gguf.GGUFWriter(out, arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["all-ones"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 1)
    for t in gguf.GGUFReader(model).tensors:
        if len(t.shape) != 2 or not t.name.endswith(".weight") or (only and not only.search(t.name)):
            continue
        n_in = int(t.shape[0])
        w.add_tensor(t.name + ".in_sum2", np.ones((1, n_in), dtype=np.float32))
        w.add_tensor(t.name + ".counts", np.ones((1, 1), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
