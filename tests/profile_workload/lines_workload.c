// A function whose source line the symbolizer's tests look up in a file built by clang,
// whose DWARF has no .debug_aranges (clang and rustc write none unless asked to).
__attribute__((noinline, used)) int emd_lined_by_clang(int x) {
  return x * 7 + 3; /* emd_lined_by_clang's line */
}

int main(int argc, char **argv) {
  (void)argv;
  return emd_lined_by_clang(argc) == 10 ? 0 : 1;
}
