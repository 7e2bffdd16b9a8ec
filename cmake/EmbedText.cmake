# Writes OUT, a C++ source that defines `std::string_view NAME()` in namespace NAMESPACE
# returning the bytes of file IN as they are: a page kept as an .html file, served from the
# daemon's own image. Bytes, not a string literal: whatever the file holds compiles.
#   cmake -DIN=... -DOUT=... -DNAME=... -DNAMESPACE=... -DHEADER=... -P EmbedText.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR size "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# Lines of 16 bytes, for a readable file (CMake's expressions have no {16}).
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n  " bytes "${bytes}")
file(WRITE "${OUT}.tmp" "// Made by cmake/EmbedText.cmake from ${IN}: do not edit.
#include \"${HEADER}\"

namespace ${NAMESPACE} {

namespace {
constexpr unsigned char kBytes[${size}] = {
  ${bytes}
};
}  // namespace

std::string_view ${NAME}() {
  return {reinterpret_cast<const char*>(kBytes), sizeof kBytes};
}

}  // namespace ${NAMESPACE}
")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
