//! Flag introspection of SGLang's real argparse parser (embedded Python via pyo3, subprocess
//! and static wheel/source modes), audit and diff. Not built yet: tracked as issue #3.
