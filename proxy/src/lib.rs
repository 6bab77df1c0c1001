//! proxy: library; the binary in main.rs is a thin shell over it.
