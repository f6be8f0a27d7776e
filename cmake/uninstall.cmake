# Removes what the last `cmake --install` of this build put in place, as its
# install_manifest.txt lists it: the files and links only, never a directory,
# since a prefix such as /usr/local holds other packages' files beside attn's.
# The manifest's paths are without the DESTDIR of a staged install, which the
# install recorded in DESTDIR_FILE: the files are removed where it put them.
#   cmake -DMANIFEST=BUILD/install_manifest.txt \
#         -DDESTDIR_FILE=BUILD/install_destdir.txt -P uninstall.cmake
if(NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "uninstall: no ${MANIFEST}: nothing was installed from this build "
    "(run `cmake --install` first, or remove the files by hand)")
endif()
set(destdir "")
if(DESTDIR_FILE AND EXISTS "${DESTDIR_FILE}")
  file(READ "${DESTDIR_FILE}" destdir)
endif()
# a DESTDIR given here is the recorded one (absolute, as the install
# recorded it; a relative one from the directory uninstall runs in)
set(asked "")
if(NOT "$ENV{DESTDIR}" STREQUAL "")
  get_filename_component(asked "$ENV{DESTDIR}" ABSOLUTE)
endif()
if(DEFINED ENV{DESTDIR} AND NOT "${asked}" STREQUAL "${destdir}")
  message(FATAL_ERROR "uninstall: DESTDIR is '$ENV{DESTDIR}' ('${asked}'), but the last install "
    "from this build was under '${destdir}' (unset DESTDIR: uninstall removes what that "
    "install wrote)")
endif()
file(STRINGS "${MANIFEST}" listed_paths)
set(installed "")
foreach(path IN LISTS listed_paths)
  list(APPEND installed "${destdir}${path}")
endforeach()
set(removed 0)
foreach(path IN LISTS installed)
  if(IS_SYMLINK "${path}" OR EXISTS "${path}")
    if(IS_DIRECTORY "${path}" AND NOT IS_SYMLINK "${path}")
      message(FATAL_ERROR "uninstall: ${path} is a directory now; the manifest lists files only")
    endif()
    file(REMOVE "${path}")
    if(IS_SYMLINK "${path}" OR EXISTS "${path}")
      message(FATAL_ERROR "uninstall: could not remove ${path}")
    endif()
    math(EXPR removed "${removed} + 1")
  else()
    message(STATUS "uninstall: ${path} is already gone")
  endif()
endforeach()
list(LENGTH installed listed)
if(removed EQUAL 0 AND listed GREATER 0)
  # the verdict leads: CMake wraps a long error at spaces, and scripts grep for it
  message(FATAL_ERROR "uninstall: removed nothing: none of the ${listed} files ${MANIFEST} "
    "lists is there (under DESTDIR '${destdir}')")
endif()
message(STATUS "uninstall: removed ${removed} of the ${listed} files ${MANIFEST} lists")
