//! What a built shared library says about itself, read from its ELF file with
//! `goblin` (no `readelf` or `nm` needed): SONAME, needed libraries and the
//! symbols it exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC, STT_OBJECT, STT_TLS};
use goblin::elf::Elf;

/// The dynamic facts of one shared library.
#[derive(Debug)]
pub struct SharedLibrary {
    /// Where it was read from.
    pub path: PathBuf,
    /// `DT_SONAME`, when set.
    pub soname: Option<String>,
    /// Defined global (or weak) function symbols in the dynamic symbol table.
    pub functions: BTreeSet<String>,
    /// Defined global (or weak) data symbols in the dynamic symbol table.
    pub data: BTreeSet<String>,
    /// `DT_NEEDED` entries.
    pub needed: Vec<String>,
    /// A 64-bit ELF file (else 32-bit).
    pub is_64: bool,
}

impl SharedLibrary {
    /// Reads `path` (an ELF shared library).
    pub fn read(path: &Path) -> Result<SharedLibrary, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let elf = Elf::parse(&bytes)
            .map_err(|e| format!("{} is not a readable ELF file: {e}", path.display()))?;
        let mut functions = BTreeSet::new();
        let mut data = BTreeSet::new();
        for sym in elf.dynsyms.iter() {
            let exported = matches!(sym.st_bind(), STB_GLOBAL | STB_WEAK)
                && sym.st_shndx != SHN_UNDEF as usize;
            if !exported {
                continue;
            }
            let Some(name) = elf.dynstrtab.get_at(sym.st_name) else {
                return Err(format!(
                    "{}: a dynamic symbol's name is outside the string table",
                    path.display()
                ));
            };
            match sym.st_type() {
                STT_FUNC | STT_GNU_IFUNC => {
                    functions.insert(name.to_owned());
                }
                STT_OBJECT | STT_TLS => {
                    data.insert(name.to_owned());
                }
                _ => {}
            }
        }
        Ok(SharedLibrary {
            path: path.to_path_buf(),
            soname: elf.soname.map(str::to_owned),
            functions,
            data,
            needed: elf.libraries.iter().map(|s| (*s).to_owned()).collect(),
            is_64: elf.is_64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_elf_is_an_error() {
        let path = crate::cmd::workspace_root().join("Cargo.toml");
        let err = SharedLibrary::read(&path).unwrap_err();
        assert!(err.contains("not a readable ELF file"), "{err}");
    }
}
