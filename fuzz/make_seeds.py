"""Writes the small seed corpus of the gguf_reader fuzz target with gguf-py.

usage: python3 fuzz/make_seeds.py   (needs `pip install gguf numpy`)
"""
import numpy as np
import gguf

OUT = "fuzz/seeds/gguf_reader/"

w = gguf.GGUFWriter(OUT + "metadata_only.gguf", "llama")
w.add_uint8("t.u8", 1)
w.add_int8("t.i8", -1)
w.add_uint16("t.u16", 2)
w.add_int16("t.i16", -2)
w.add_uint32("t.u32", 3)
w.add_int32("t.i32", -3)
w.add_float32("t.f32", 0.5)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo")
w.add_uint64("t.u64", 4)
w.add_int64("t.i64", -4)
w.add_float64("t.f64", 0.25)
w.add_array("t.arr", ["a", "b"])
w.add_array("t.nested", [[1, 2], ["x"]])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

w = gguf.GGUFWriter(OUT + "three_tensors.gguf", "llama")
w.add_custom_alignment(64)
w.add_tensor("a.weight", np.arange(8, dtype=np.float32))
w.add_tensor("b.weight", np.full((2, 34), 3, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.add_tensor("c.weight", np.full((1, 144), 5, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
