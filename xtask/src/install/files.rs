//! The text of the installed pkg-config file and CMake package.
//!
//! Both are relocatable when the library directory is inside the prefix: the
//! pkg-config file computes `prefix` from `${pcfiledir}`, the CMake package from
//! `CMAKE_CURRENT_LIST_DIR`, so a tree installed for one prefix (or staged with
//! `DESTDIR`) works wherever it is moved. A library directory outside the prefix
//! is written as the absolute path it was given.

use std::path::{Path, PathBuf};

use super::{Options, Version, LINK_NAME};

/// Paths and names the files are written from.
#[derive(Debug)]
pub struct Layout {
    /// The library's file name, `libemm_capi.so.X.Y.Z`.
    pub file_name: String,
    soname: String,
    version: Version,
    description: String,
    prefix: String,
    libdir: String,
    /// The library directory relative to the prefix, when inside it.
    rel_libdir: Option<String>,
    pointer_bytes: u8,
}

fn utf8(p: &Path) -> Result<String, String> {
    p.to_str()
        .map(|s| s.trim_end_matches('/').to_owned())
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

impl Layout {
    /// The layout of an installation with `options` of a library of `version`
    /// whose SONAME is `soname`.
    pub fn new(
        options: &Options,
        version: &Version,
        soname: &str,
        description: &str,
        is_64: bool,
    ) -> Result<Layout, String> {
        let rel_libdir = match options.libdir.strip_prefix(&options.prefix) {
            Ok(rel) => Some(utf8(rel)?),
            Err(_) => None,
        };
        Ok(Layout {
            file_name: format!("{LINK_NAME}.{}", version.core()),
            soname: soname.to_owned(),
            version: version.clone(),
            description: description.replace(['\n', '\r'], " ").replace('$', "$$"),
            prefix: utf8(&options.prefix)?,
            libdir: utf8(&options.libdir)?,
            rel_libdir,
            pointer_bytes: if is_64 { 8 } else { 4 },
        })
    }

    /// `levels` times `/..`.
    fn ups(levels: usize) -> String {
        "/..".repeat(levels)
    }

    fn depth(rel: &str) -> usize {
        PathBuf::from(rel).components().count()
    }

    /// `LIBDIR/pkgconfig/emm.pc`.
    pub fn pkg_config(&self) -> String {
        let (prefix, libdir, note) = match &self.rel_libdir {
            Some(rel) => (
                format!("${{pcfiledir}}{}", Self::ups(Self::depth(rel) + 1)),
                if rel.is_empty() {
                    "${prefix}".to_owned()
                } else {
                    format!("${{prefix}}/{rel}")
                },
                format!(
                    "# Relocatable: the prefix is found from this file's directory (installed for {}).\n",
                    self.prefix
                ),
            ),
            None => (self.prefix.clone(), self.libdir.clone(), String::new()),
        };
        format!(
            "# pkg-config file of emm (libemm_capi), written by `cargo xtask install`.\n{note}\
             prefix={prefix}\n\
             libdir={libdir}\n\
             includedir=${{prefix}}/include\n\
             \n\
             Name: emm\n\
             Description: {}\n\
             Version: {}\n\
             Cflags: -I${{includedir}}\n\
             Libs: -L${{libdir}} -lemm_capi\n",
            self.description, self.version.text
        )
    }

    /// `LIBDIR/cmake/emm/emmConfig.cmake`: the imported target `emm::emm`.
    pub fn cmake_config(&self) -> String {
        let (prefix, libdir) = match &self.rel_libdir {
            Some(rel) => (
                format!(
                    "get_filename_component(_emm_prefix \"${{CMAKE_CURRENT_LIST_DIR}}{}\" ABSOLUTE)",
                    Self::ups(Self::depth(rel) + 2)
                ),
                if rel.is_empty() {
                    "${_emm_prefix}".to_owned()
                } else {
                    format!("${{_emm_prefix}}/{rel}")
                },
            ),
            None => (
                format!("set(_emm_prefix \"{}\")", self.prefix),
                self.libdir.clone(),
            ),
        };
        format!(
            r#"# CMake package of emm (libemm_capi) {version}, written by `cargo xtask install`.
#
#   find_package(emm CONFIG REQUIRED)
#   target_link_libraries(your_target PRIVATE emm::emm)
#
# emm::emm is the shared library with its include directory. Paths are computed
# from this file's location, so the installed tree can be moved.

{prefix}
set(_emm_library "{libdir}/{file}")
set(_emm_include "${{_emm_prefix}}/include")

foreach(_emm_file IN ITEMS "${{_emm_library}}" "${{_emm_include}}/emm.h")
  if(NOT EXISTS "${{_emm_file}}")
    set(emm_FOUND FALSE)
    set(emm_NOT_FOUND_MESSAGE "the emm package in ${{CMAKE_CURRENT_LIST_DIR}} is incomplete: ${{_emm_file}} is missing")
    unset(_emm_file)
    unset(_emm_library)
    unset(_emm_include)
    unset(_emm_prefix)
    return()
  endif()
endforeach()
unset(_emm_file)

if(NOT TARGET emm::emm)
  add_library(emm::emm SHARED IMPORTED)
  set_target_properties(emm::emm PROPERTIES
    IMPORTED_LOCATION "${{_emm_library}}"
    IMPORTED_SONAME "{soname}"
    INTERFACE_INCLUDE_DIRECTORIES "${{_emm_include}}")
endif()

set(emm_LIBRARY "${{_emm_library}}")
set(emm_INCLUDE_DIR "${{_emm_include}}")
unset(_emm_library)
unset(_emm_include)
unset(_emm_prefix)
"#,
            version = self.version.text,
            file = self.file_name,
            soname = self.soname,
        )
    }

    /// `LIBDIR/cmake/emm/emmConfigVersion.cmake`: which requested versions this one
    /// meets. Before 1.0 the same minor version, at least as new (a 0.x minor
    /// release may break, as the SONAME says; for 0.0.x the same version); from 1.0
    /// on the same major version.
    /// A range (`find_package(emm 0.1...0.3)`) is met by any version inside it.
    pub fn cmake_config_version(&self) -> String {
        let [major, minor, patch] = self.version.numbers;
        let line = match (major, minor) {
            (0, 0) => format!("0.0.{patch}"),
            (0, _) => format!("0.{minor}"),
            _ => major.to_string(),
        };
        format!(
            r#"# Version of the CMake package of emm, written by `cargo xtask install`.
set(PACKAGE_VERSION "{core}")
set(PACKAGE_VERSION_COMPATIBLE FALSE)

if(PACKAGE_FIND_VERSION_RANGE)
  if(PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION_MIN
     AND ((PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "INCLUDE" AND PACKAGE_VERSION VERSION_LESS_EQUAL PACKAGE_FIND_VERSION_MAX)
          OR (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL "EXCLUDE" AND PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION_MAX)))
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
elseif(NOT DEFINED PACKAGE_FIND_VERSION OR PACKAGE_FIND_VERSION STREQUAL "")
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
else()
  # Compatible within one line: "0.0.<patch>" for 0.0.x, "0.<minor>" before 1.0,
  # "<major>" after.
  if(PACKAGE_FIND_VERSION_MAJOR EQUAL 0 AND PACKAGE_FIND_VERSION_MINOR EQUAL 0)
    set(_emm_requested_line "0.0.${{PACKAGE_FIND_VERSION_PATCH}}")
  elseif(PACKAGE_FIND_VERSION_MAJOR EQUAL 0)
    set(_emm_requested_line "0.${{PACKAGE_FIND_VERSION_MINOR}}")
  else()
    set(_emm_requested_line "${{PACKAGE_FIND_VERSION_MAJOR}}")
  endif()
  if(_emm_requested_line STREQUAL "{line}" AND PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION)
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
  unset(_emm_requested_line)
endif()

# A {bits}-bit library does not suit a project of another pointer size.
if(CMAKE_SIZEOF_VOID_P AND NOT CMAKE_SIZEOF_VOID_P STREQUAL "{bytes}")
  set(PACKAGE_VERSION "${{PACKAGE_VERSION}} ({bits}-bit)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
"#,
            core = self.version.core(),
            bytes = self.pointer_bytes,
            bits = u32::from(self.pointer_bytes) * 8,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(prefix: &str, libdir: &str, version: &str) -> Layout {
        let options = Options::parse(
            &[
                "--prefix".to_owned(),
                prefix.to_owned(),
                "--libdir".to_owned(),
                libdir.to_owned(),
            ],
            None,
        )
        .unwrap();
        let v = Version::parse(version).unwrap();
        Layout::new(
            &options,
            &v,
            "libemm_capi.so.0.1",
            "The C ABI of emm: $x",
            true,
        )
        .unwrap()
    }

    #[test]
    fn the_pkg_config_file_finds_its_prefix_from_its_own_directory() {
        let pc = layout("/opt/emm", "lib", "0.1.0").pkg_config();
        assert!(pc.contains("prefix=${pcfiledir}/../..\n"), "{pc}");
        assert!(pc.contains("libdir=${prefix}/lib\n"), "{pc}");
        assert!(pc.contains("includedir=${prefix}/include\n"), "{pc}");
        assert!(pc.contains("Version: 0.1.0\n"), "{pc}");
        assert!(pc.contains("Libs: -L${libdir} -lemm_capi\n"), "{pc}");
        assert!(pc.contains("Description: The C ABI of emm: $$x\n"), "{pc}");
        let deep = layout("/opt/emm", "lib/x86_64-linux-gnu", "0.1.0").pkg_config();
        assert!(deep.contains("prefix=${pcfiledir}/../../..\n"), "{deep}");
        assert!(
            deep.contains("libdir=${prefix}/lib/x86_64-linux-gnu\n"),
            "{deep}"
        );
        let outside = layout("/opt/emm", "/usr/lib64", "0.1.0").pkg_config();
        assert!(
            outside.contains("prefix=/opt/emm\nlibdir=/usr/lib64\n"),
            "{outside}"
        );
    }

    #[test]
    fn the_cmake_package_computes_its_paths_and_names_the_soname() {
        let c = layout("/opt/emm", "lib", "0.1.0").cmake_config();
        assert!(
            c.contains("get_filename_component(_emm_prefix \"${CMAKE_CURRENT_LIST_DIR}/../../..\" ABSOLUTE)"),
            "{c}"
        );
        assert!(
            c.contains("set(_emm_library \"${_emm_prefix}/lib/libemm_capi.so.0.1.0\")"),
            "{c}"
        );
        assert!(c.contains("IMPORTED_SONAME \"libemm_capi.so.0.1\""), "{c}");
        assert!(c.contains("add_library(emm::emm SHARED IMPORTED)"), "{c}");
        let deep = layout("/opt/emm", "lib64/x", "0.1.0").cmake_config();
        assert!(
            deep.contains("${CMAKE_CURRENT_LIST_DIR}/../../../..\""),
            "{deep}"
        );
        let outside = layout("/opt/emm", "/usr/lib64", "0.1.0").cmake_config();
        assert!(
            outside.contains("set(_emm_prefix \"/opt/emm\")"),
            "{outside}"
        );
        assert!(
            outside.contains("\"/usr/lib64/libemm_capi.so.0.1.0\""),
            "{outside}"
        );
    }

    #[test]
    fn the_version_file_keeps_0x_minor_lines_apart() {
        let v = layout("/opt/emm", "lib", "0.1.2").cmake_config_version();
        assert!(v.contains("set(PACKAGE_VERSION \"0.1.2\")"), "{v}");
        assert!(v.contains("STREQUAL \"0.1\""), "{v}");
        assert!(v.contains("NOT CMAKE_SIZEOF_VOID_P STREQUAL \"8\""), "{v}");
        let zero = layout("/opt/emm", "lib", "0.0.3").cmake_config_version();
        assert!(zero.contains("STREQUAL \"0.0.3\""), "{zero}");
        let one = layout("/opt/emm", "lib", "1.4.0-rc.1").cmake_config_version();
        assert!(one.contains("set(PACKAGE_VERSION \"1.4.0\")"), "{one}");
        assert!(one.contains("STREQUAL \"1\""), "{one}");
    }
}
