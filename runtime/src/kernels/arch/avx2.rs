//! placeholder
use crate::kernels::{DotTable, scalar};

pub(crate) static TABLE: DotTable = scalar::TABLE;
