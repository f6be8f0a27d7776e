# Writes the attn(1) man page from the --help of the built attn and of each
# command it lists, into the template cmake/attn.1.in. Run as
#   cmake -DATTN=path/to/attn -DTEMPLATE=cmake/attn.1.in -DOUT=attn.1
#         -DATTN_VERSION=0.1.0 -P cmake/gen-manpage.cmake
cmake_minimum_required(VERSION 3.16)

# troff: a backslash is written \e, and a line may not start with . or '.
function(troff_escape text out)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

execute_process(COMMAND ${ATTN} --help OUTPUT_VARIABLE overview RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${ATTN} --help failed (${rc})")
endif()
string(REGEX REPLACE "\n$" "" overview "${overview}")

# The commands: the two-space-indented lines after "commands:".
string(REGEX MATCH "commands:\n(([ ][ ][a-z]+[^\n]*\n)+)" block "${overview}\n")
string(REGEX MATCHALL "\n  [a-z]+" names "\n${CMAKE_MATCH_1}")
set(sections "")
foreach(name IN LISTS names)
  string(STRIP "${name}" name)
  if(name STREQUAL "version")
    continue()
  endif()
  execute_process(COMMAND ${ATTN} ${name} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${ATTN} ${name} --help failed (${rc})")
  endif()
  string(REGEX REPLACE "\n$" "" help "${help}")
  troff_escape("${help}" help)
  string(APPEND sections ".SS attn ${name}\n.nf\n${help}\n.fi\n")
endforeach()
if(sections STREQUAL "")
  message(FATAL_ERROR "found no commands in ${ATTN} --help")
endif()

troff_escape("${overview}" ATTN_MAN_OVERVIEW)
set(ATTN_MAN_COMMANDS "${sections}")
configure_file(${TEMPLATE} ${OUT} @ONLY)
