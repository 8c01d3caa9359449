//! emm
