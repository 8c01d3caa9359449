//! [`Module`] loaded from PTX, and [`Function`] launch.

use core::ffi::c_void;
use std::ffi::CString;

use emm_sys::{CUfunction, CUmodule};

use crate::context::Context;
use crate::error::{check, DriverError, Result};
use crate::stream::Stream;

/// A module loaded from PTX text in memory; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: CUmodule,
    ctx: Context,
}

// SAFETY: the handle is an opaque identifier usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// JIT-compiles and loads `ptx`.
    pub fn load_ptx(ctx: &Context, ptx: &str) -> Result<Module> {
        ctx.check_deferred()?;
        let image = CString::new(ptx).map_err(|e| {
            DriverError::invalid(
                "PTX text",
                "text without NUL bytes",
                format!("a NUL at byte {}", e.nul_position()),
            )
        })?;
        let _g = ctx.push()?;
        let drv = ctx.driver();
        let mut raw = CUmodule::NULL;
        // SAFETY: the context is current; `image` is a NUL-terminated PTX image.
        check(drv, "cuModuleLoadData", unsafe {
            (drv.module_load_data)(&mut raw, image.as_ptr().cast())
        })?;
        Ok(Module {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// The kernel `name`.
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let cname = CString::new(name)
            .map_err(|_| DriverError::invalid("kernel name", name, "a NUL byte"))?;
        let drv = self.ctx.driver();
        let mut raw = CUfunction::NULL;
        // SAFETY: the module is alive; `cname` is NUL-terminated.
        check(drv, "cuModuleGetFunction", unsafe {
            (drv.module_get_function)(&mut raw, self.raw, cname.as_ptr())
        })?;
        Ok(Function { raw, module: self })
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let drv = self.ctx.driver();
        let r = match self.ctx.push() {
            // SAFETY: we loaded this module and unload it once.
            Ok(_g) => check(drv, "cuModuleUnload", unsafe {
                (drv.module_unload)(self.raw)
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            self.ctx.record_drop_error(e);
        }
    }
}

/// Grid and block dimensions of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch that covers `n` elements with `block` threads per block.
    pub fn for_elements(n: usize, block: u32) -> LaunchConfig {
        let block = block.max(1);
        let grid = n.div_ceil(block as usize).max(1);
        LaunchConfig {
            grid: (u32::try_from(grid).unwrap_or(u32::MAX), 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// A kernel of a loaded [`Module`].
#[derive(Debug, Clone, Copy)]
pub struct Function<'m> {
    raw: CUfunction,
    module: &'m Module,
}

impl Function<'_> {
    /// The raw handle.
    pub fn raw(&self) -> CUfunction {
        self.raw
    }

    /// Launches the kernel on `stream`.
    ///
    /// # Safety
    /// `params` must hold, in order, one pointer per kernel parameter, each pointing
    /// at a value of exactly that parameter's type, and every device pointer passed
    /// must be valid for what the kernel does with it until the launch completes.
    pub unsafe fn launch(
        &self,
        config: LaunchConfig,
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let ctx = &self.module.ctx;
        ctx.check_deferred()?;
        let _g = ctx.push()?;
        let drv = ctx.driver();
        let (gx, gy, gz) = config.grid;
        let (bx, by, bz) = config.block;
        // SAFETY: the caller vouches for `params`; the module (hence the function)
        // and the stream are alive; the context is current.
        let r = unsafe {
            (drv.launch_kernel)(
                self.raw,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                config.shared_mem_bytes,
                stream.raw(),
                params.as_mut_ptr(),
                core::ptr::null_mut(),
            )
        };
        check(drv, "cuLaunchKernel", r)
    }
}
