//! AVX-512 kernels (placeholder: the AVX2 table until specialised).
pub(crate) static TABLE: crate::kernels::DotTable = super::avx2::TABLE;
