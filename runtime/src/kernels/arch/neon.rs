//! placeholder
use crate::kernels::{DotTable, scalar};

pub(crate) static TABLE: DotTable = scalar::TABLE;
pub(crate) static TABLE_DOT: DotTable = scalar::TABLE;
