//! emm-hostonly
