# Build rules for the kernel side: vmlinux.h from BTF, clang -target bpf, bpftool skeletons.
find_program(BPF_CLANG NAMES clang clang-14 REQUIRED)
find_program(BPFTOOL NAMES bpftool PATHS /usr/sbin /sbin REQUIRED)

set(BPF_GEN_DIR ${CMAKE_BINARY_DIR}/bpf-gen)
file(MAKE_DIRECTORY ${BPF_GEN_DIR})

if(EBPF_METRICSD_VMLINUX_H)
  configure_file(${EBPF_METRICSD_VMLINUX_H} ${BPF_GEN_DIR}/vmlinux.h COPYONLY)
  add_custom_target(vmlinux_h)
else()
  add_custom_command(
    OUTPUT ${BPF_GEN_DIR}/vmlinux.h
    COMMAND ${BPFTOOL} btf dump file ${EBPF_METRICSD_BTF} format c > ${BPF_GEN_DIR}/vmlinux.h.tmp
    COMMAND ${CMAKE_COMMAND} -E rename ${BPF_GEN_DIR}/vmlinux.h.tmp ${BPF_GEN_DIR}/vmlinux.h
    DEPENDS ${EBPF_METRICSD_BTF}
    COMMENT "Generating vmlinux.h from ${EBPF_METRICSD_BTF}")
  add_custom_target(vmlinux_h DEPENDS ${BPF_GEN_DIR}/vmlinux.h)
endif()

if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(BPF_TARGET_ARCH x86)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  set(BPF_TARGET_ARCH arm64)
else()
  set(BPF_TARGET_ARCH ${CMAKE_SYSTEM_PROCESSOR})
endif()

# ebpf_metricsd_bpf_skeletons(<target> <x.bpf.c>...): an INTERFACE library whose include
# directory holds <x>.skel.h for every source.
function(ebpf_metricsd_bpf_skeletons target)
  set(headers)
  foreach(src ${ARGN})
    get_filename_component(stem ${src} NAME)
    string(REPLACE ".bpf.c" "" stem ${stem})
    get_filename_component(src_dir ${src} DIRECTORY)
    set(obj ${BPF_GEN_DIR}/${stem}.bpf.o)
    set(skel ${BPF_GEN_DIR}/${stem}.skel.h)
    file(GLOB common_headers ${CMAKE_SOURCE_DIR}/bpf/common/*.h ${src_dir}/*.h)
    set(BPF_WERROR "")
    if(EBPF_METRICSD_WERROR)
      set(BPF_WERROR -Werror)
    endif()
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${BPF_CLANG} -g -O2 -target bpf -D__TARGET_ARCH_${BPF_TARGET_ARCH}
              -Wall ${BPF_WERROR} -I${BPF_GEN_DIR} -I${CMAKE_SOURCE_DIR}/bpf -I${src_dir}
              -I/usr/include/${CMAKE_LIBRARY_ARCHITECTURE}
              -c ${src} -o ${obj}.tmp
      COMMAND ${BPFTOOL} gen object ${obj} ${obj}.tmp
      COMMAND ${CMAKE_COMMAND} -E remove ${obj}.tmp
      DEPENDS ${src} ${common_headers} vmlinux_h ${BPF_GEN_DIR}/vmlinux.h
      COMMENT "BPF ${stem}.bpf.c")
    add_custom_command(
      OUTPUT ${skel}
      COMMAND ${BPFTOOL} gen skeleton ${obj} name ${stem} > ${skel}.tmp
      COMMAND ${CMAKE_COMMAND} -E rename ${skel}.tmp ${skel}
      DEPENDS ${obj}
      COMMENT "Skeleton ${stem}.skel.h")
    list(APPEND headers ${skel})
  endforeach()
  add_custom_target(${target}_gen DEPENDS ${headers})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_gen)
  target_include_directories(${target} INTERFACE ${BPF_GEN_DIR})
endfunction()
