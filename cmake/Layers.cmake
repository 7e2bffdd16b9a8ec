# The daemon's layers: one folder under src/ and one static library each, named emd_<layer>.
# A layer's public headers are src/<layer>/include/ebpf_metricsd/<layer>/*.h, and its include
# directory reaches only what it links: the layers below it. So an include that reaches up
# does not compile ("ebpf_metricsd/profile/...: No such file or directory"), and a layer may
# only link layers defined before it (src/CMakeLists.txt adds them bottom up).
#
# emd_layer(<layer> SOURCES <files> [LAYERS <layers below>] [PUBLIC <libs>] [PRIVATE <libs>])
function(emd_layer layer)
  cmake_parse_arguments(L "" "" "SOURCES;LAYERS;PUBLIC;PRIVATE" ${ARGN})
  foreach(below ${L_LAYERS})
    if(NOT TARGET emd_${below})
      message(FATAL_ERROR "layer ${layer} uses ${below}, which is not a layer below it "
                          "(src/CMakeLists.txt adds the layers bottom up)")
    endif()
  endforeach()
  set(target emd_${layer})
  add_library(${target} STATIC ${L_SOURCES})
  target_include_directories(${target} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/${layer}/include)
  target_compile_options(${target} PRIVATE ${OUR_WARNINGS})
  list(TRANSFORM L_LAYERS PREPEND emd_)
  target_link_libraries(${target} PUBLIC ${L_LAYERS} ${L_PUBLIC})
  if(L_PRIVATE)
    target_link_libraries(${target} PRIVATE ${L_PRIVATE})
  endif()
endfunction()
