//! emm-driver
