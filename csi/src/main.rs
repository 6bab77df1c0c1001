//! `skiff-csi`: the CSI driver's binary (node plugin and controller).

fn main() {
    eprintln!("skiff-csi: not implemented yet");
    std::process::exit(2);
}
