import sympy

from layouts import seed


def test_seed_v_formula_derived_in_the_seeds_field_names():
    d = seed.seed_v()
    assert sympy.expand(seed.element_formula(d) - seed.SEED_ELEMENT_FORMULA) == 0
    assert d.formula_c == "(n & 7) * 2 + ((k & 7) ^ ((n >> 3) & 7)) * 16 + (k & 7) * 128 + (n >> 6) * 1024 + (k >> 3) * 2048"


def test_seed_v_descriptor_and_five_d_tensor_map():
    d = seed.seed_v()
    f = d.descriptor_fields()
    assert (f["kind"], f["major"], f["lbo"], f["sbo"], f["swizzle_code"], f["fixed_46_48"]) == \
        ("tcgen05", "MN", 1024, 2048, 2, 1)
    tm = d.tensor_map
    assert tm.dims_symbolic == ("64", "8", "2", "H", "B*S/8") and tm.box == (64, 8, 2, 1, 16)
    p = tm.instantiate(batch=1, seq_len=1024, heads=64, stride_b=0, stride_s=64 * 128, stride_h=128)
    row = 64 * 128 * 2
    assert p.dims == (64, 8, 2, 64, 128) and p.strides_bytes == (row, 128, 256, 8 * row)
    assert d.verify() == []


def test_wrong_n_vec_formula_fails_on_k1():
    mismatches = seed.seed_v().check_formula(seed.WRONG_N_VEC_C)
    basis = [str(m) for m in mismatches if m.basis]
    assert basis == ["formula: inject (k=1, n=0): expected byte 144, model reads byte 128 (n off by 8)"]


def test_wrong_physical_row_fails_on_n64_reading_row_k_xor_1_col_72():
    mismatches = seed.seed_v().check_formula(seed.WRONG_ROW_C)
    basis = [m for m in mismatches if m.basis]
    assert [str(m) for m in basis] == [
        "formula: inject (k=0, n=64): expected byte 1024, model reads byte 1152 (k off by 1, n off by 8)"]
    assert basis[0].decoded == {"k": 1, "n": 72}


def test_four_d_box_places_atoms_side_by_side():
    d = seed.seed_v()
    mismatches = {tuple(m.coords.values()): m for m in seed.four_d_box_mismatches(d) if m.basis}
    # Row k=1 starts 256 B in (two 128-byte atoms side by side), not 128 B into the first atom.
    assert str(mismatches[(1, 0)]) == "TMA: inject (k=1, n=0): expected byte 144, model reads byte 288 (k off by 1)"
    # Column 64 (atom B) lands right after row 0 of atom A instead of 1024 B later.
    assert mismatches[(0, 64)].actual == 144 and mismatches[(0, 64)].expected == 1024
    assert seed.four_d_box().box_bytes == d.smem_bytes
