# `cpack -G DEB` in the build directory: the daemon, its config as a conffile, the systemd
# unit, dashboards and Prometheus rules.
install(TARGETS ebpf-metricsd RUNTIME DESTINATION bin)
install(FILES ${CMAKE_SOURCE_DIR}/config/ebpf-metricsd.yaml
        DESTINATION /etc/ebpf-metricsd RENAME config.yaml)
install(FILES ${CMAKE_SOURCE_DIR}/systemd/ebpf-metricsd.service DESTINATION /lib/systemd/system)
install(FILES ${CMAKE_SOURCE_DIR}/systemd/profile.conf DESTINATION share/ebpf-metricsd/systemd)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/dashboards/ DESTINATION share/ebpf-metricsd/dashboards
        FILES_MATCHING PATTERN "*.json")
install(FILES ${CMAKE_SOURCE_DIR}/packaging/grafana/datasource.yml
        DESTINATION share/ebpf-metricsd/grafana)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/packaging/prometheus/
        DESTINATION share/ebpf-metricsd/prometheus FILES_MATCHING PATTERN "*.yml")
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION share/doc/ebpf-metricsd)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION share/doc/ebpf-metricsd/docs
        FILES_MATCHING PATTERN "*.md")

# The tracers the description names, read from the registry's table in
# src/tracers/registry.cpp (one "TracerDescriptor <name>_descriptor();" line each), in its
# order, wrapped as Debian wants an extended description.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                                     ${CMAKE_SOURCE_DIR}/src/tracers/registry.cpp)
file(STRINGS ${CMAKE_SOURCE_DIR}/src/tracers/registry.cpp registry_lines
     REGEX "^TracerDescriptor [a-z0-9_]+_descriptor\\(\\);$")
set(description_lines "")
set(line "Tracers:")
foreach(entry IN LISTS registry_lines)
  string(REGEX REPLACE "^TracerDescriptor ([a-z0-9_]+)_descriptor.*$" "\\1" name "${entry}")
  string(LENGTH "${line} ${name}," width)
  if(width GREATER 76)
    string(APPEND description_lines "${line}\n")
    set(line "${name},")
  else()
    string(APPEND line " ${name},")
  endif()
endforeach()
string(REGEX REPLACE ",$" "." line "${line}")
string(APPEND description_lines "${line}")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ebpf-metricsd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_CONTACT "ebpf-metricsd maintainers <ebpf-metricsd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "eBPF tracers exported as Prometheus metrics")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "Loads eBPF tracers into the kernel and serves what they measure on /metrics for\nPrometheus; profile serves on-CPU and off-CPU stacks as pprof and a flame graph.\n${description_lines}")
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
# Library dependencies as dpkg-shlibdeps finds them.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/deb/conffiles
    ${CMAKE_SOURCE_DIR}/packaging/deb/postinst
    ${CMAKE_SOURCE_DIR}/packaging/deb/prerm
    ${CMAKE_SOURCE_DIR}/packaging/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
