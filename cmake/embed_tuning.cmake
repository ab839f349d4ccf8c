# Embeds the shipped tuning tables (tuning/*.json) into the library, so that a build carried to
# another machine still finds them. Regenerated when a table changes.
file(GLOB tables "${SRC_DIR}/tuning/*.json")
set(body "// Generated from tuning/*.json by cmake/embed_tuning.cmake. Do not edit.\n#pragma once\n")
string(APPEND body "namespace symmem::detail {\nstruct ShippedTable { const char* gpu_file; const char* json; };\n")
string(APPEND body "inline constexpr ShippedTable kShippedTables[] = {\n")
foreach(table ${tables})
  get_filename_component(name "${table}" NAME_WE)
  file(READ "${table}" json)
  string(APPEND body "  {\"${name}\", R\"symmem_json(${json})symmem_json\"},\n")
endforeach()
string(APPEND body "  {nullptr, nullptr}\n};\n}  // namespace symmem::detail\n")
file(WRITE "${OUT_FILE}.tmp" "${body}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT_FILE}.tmp" "${OUT_FILE}")
