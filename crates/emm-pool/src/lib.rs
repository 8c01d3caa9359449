//! emm-pool
