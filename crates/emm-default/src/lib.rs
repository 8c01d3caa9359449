//! emm-default
