//! emm-core
