//! The length of xtask's functions: none longer than a hundred lines ([`LONGEST`]), so that a
//! long task reads as a list of named steps, each with a doc comment saying what it does.
//!
//! The rule: every function of `xtask/src` with a body (free functions, methods, trait methods'
//! default bodies, functions inside functions) counts, in lines of its file, from its `fn` line
//! to its closing brace; its doc comment and attributes do not count. Test code is exempt:
//! `#[test]` functions, items under `#[cfg(test)]`, and the module files a `#[cfg(test)] mod x;`
//! declares, with the files beneath them. Each file is parsed with `syn`, its lines read from
//! `proc-macro2`'s span locations.

use std::path::{Path, PathBuf};
use syn::visit::{self, Visit};
use syn::{Attribute, Block, ImplItemFn, ItemFn, ItemImpl, ItemMod, ItemTrait, Meta, Signature};

/// The most lines an xtask function may take.
const LONGEST: usize = 100;

/// One function: its name, the line of its `fn` and how many lines it takes.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

/// Whether `attrs` make an item test code: `#[test]` or `#[cfg(test)]`.
fn is_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || matches!(&a.meta, Meta::List(l) if l.path.is_ident("cfg") && l.tokens.to_string() == "test")
    })
}

/// Walks one file's syntax tree, collecting its functions outside test code and the module files
/// it declares as test code.
#[derive(Debug, Default)]
struct FunctionVisitor {
    /// The functions found, in the order of the file.
    functions: Vec<Function>,
    /// Each `#[cfg(test)] mod x;`, as the path of its file from the file's folder of children
    /// without the extension (`x`, or `a/x` inside an inline `mod a { }`).
    test_modules: Vec<String>,
    /// The inline modules the visitor is in.
    inline: Vec<String>,
}

impl FunctionVisitor {
    /// Records the function of `sig` and `block`.
    fn function(&mut self, sig: &Signature, block: &Block) {
        let line = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        self.functions.push(Function { name: sig.ident.to_string(), line, lines: end - line + 1 });
    }
}

impl<'ast> Visit<'ast> for FunctionVisitor {
    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        if !is_test(&f.attrs) {
            self.function(&f.sig, &f.block);
            visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        if !is_test(&f.attrs) {
            self.function(&f.sig, &f.block);
            visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if !is_test(&f.attrs) {
            if let Some(block) = &f.default {
                self.function(&f.sig, block);
            }
            visit::visit_trait_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast ItemImpl) {
        if !is_test(&i.attrs) {
            visit::visit_item_impl(self, i);
        }
    }

    fn visit_item_trait(&mut self, t: &'ast ItemTrait) {
        if !is_test(&t.attrs) {
            visit::visit_item_trait(self, t);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        let name = m.ident.to_string();
        if is_test(&m.attrs) {
            if m.content.is_none() {
                let path: Vec<&str> =
                    self.inline.iter().map(String::as_str).chain([name.as_str()]).collect();
                self.test_modules.push(path.join("/"));
            }
            return;
        }
        self.inline.push(name);
        visit::visit_item_mod(self, m);
        self.inline.pop();
    }
}

/// The functions of `source` outside test code, and the module files it declares as test code.
fn functions_of(source: &str) -> syn::Result<FunctionVisitor> {
    let file = syn::parse_file(source)?;
    let mut visitor = FunctionVisitor::default();
    visitor.visit_file(&file);
    Ok(visitor)
}

/// The folder of the module files `file` declares: its own folder for `main.rs`, `lib.rs` and
/// `mod.rs`, else the folder named as it, beside it.
fn children_folder(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new(""));
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("main" | "lib" | "mod") | None => parent.to_path_buf(),
        Some(stem) => parent.join(stem),
    }
}

/// Every function of the files under `src` outside test code, each with its file.
fn functions_under(src: &Path) -> Vec<(PathBuf, Function)> {
    let mut test_files: Vec<PathBuf> = Vec::new();
    let mut found = Vec::new();
    for file in super::rust_files(src) {
        let text = std::fs::read_to_string(&file).unwrap();
        let visitor =
            functions_of(&text).unwrap_or_else(|e| panic!("{}: cannot parse: {e}", file.display()));
        let children = children_folder(&file);
        test_files.extend(visitor.test_modules.iter().map(|m| children.join(m)));
        found.extend(visitor.functions.into_iter().map(|f| (file.clone(), f)));
    }
    // A test module's file, `x.rs` or `x/mod.rs`, and every file beneath `x/`.
    let in_test_module = |file: &Path| {
        test_files.iter().any(|t| file.starts_with(t) || file == t.with_extension("rs"))
    };
    found.retain(|(file, _)| !in_test_module(file));
    found
}

/// No function of xtask outside test code is longer than [`LONGEST`] lines: a longer one becomes
/// named steps, each documented. Counted: every function of `xtask/src` with a body (free
/// functions, methods, trait methods' default bodies, functions inside functions), in lines of
/// its file from its `fn` line to its closing brace. Not counted: `#[test]` functions, items
/// under `#[cfg(test)]`, and the files of modules declared `#[cfg(test)] mod x;`.
#[test]
fn no_xtask_function_is_longer_than_a_hundred_lines() {
    let root = crate::workspace::root();
    let functions = functions_under(&root.join("xtask/src"));
    assert!(functions.len() > 300, "found only {} functions: the scan is broken", functions.len());
    let long: Vec<String> = functions
        .iter()
        .filter(|(_, f)| f.lines > LONGEST)
        .map(|(file, f)| {
            let file = file.strip_prefix(&root).unwrap_or(file).display();
            format!("  {file}:{} {}: {} lines", f.line, f.name, f.lines)
        })
        .collect();
    assert!(
        long.is_empty(),
        "xtask functions longer than {LONGEST} lines (from `fn` to the closing brace); split each \
         into named steps, each with a doc comment saying what it does:\n{}",
        long.join("\n")
    );
}

/// A function's length runs from its `fn` line to its closing brace, doc comment and attributes
/// left out; nested functions and methods count on their own; test code is not counted, and a
/// `#[cfg(test)] mod x;` names a test module's file.
#[test]
fn a_functions_length_runs_from_fn_to_its_closing_brace_outside_test_code() {
    let visitor = functions_of(
        "/// Doc.\n\
         #[inline]\n\
         fn one() {}\n\
         fn outer() {\n\
             fn inner() {\n\
             }\n\
         }\n\
         impl S {\n\
             pub(crate) fn method(\n\
                 &self,\n\
             ) -> u8 { 1 }\n\
         }\n\
         trait T { fn required(&self); fn provided(&self) {\n} }\n\
         #[test]\n\
         fn a_test() {}\n\
         #[cfg(test)]\n\
         mod tests { fn helper() {} }\n\
         #[cfg(test)]\n\
         impl S { fn test_only() {} }\n\
         #[cfg(test)]\n\
         mod beside;\n\
         mod inline { #[cfg(test)] mod nested; }",
    )
    .unwrap();
    let got: Vec<(&str, usize, usize)> =
        visitor.functions.iter().map(|f| (f.name.as_str(), f.line, f.lines)).collect();
    assert_eq!(
        got,
        [("one", 3, 1), ("outer", 4, 4), ("inner", 5, 2), ("method", 9, 3), ("provided", 13, 2)]
    );
    assert_eq!(visitor.test_modules, ["beside", "inline/nested"]);
}

/// The files a `#[cfg(test)] mod x;` declares are found beside `main.rs` and in the folder
/// named as any other file.
#[test]
fn a_test_modules_file_is_beside_main_or_in_its_parents_folder() {
    assert_eq!(children_folder(Path::new("src/main.rs")), Path::new("src"));
    assert_eq!(children_folder(Path::new("src/vm/mod.rs")), Path::new("src/vm"));
    assert_eq!(children_folder(Path::new("src/vm.rs")), Path::new("src/vm"));
}
