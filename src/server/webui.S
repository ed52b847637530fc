// The chat page (server/webui/index.html) linked into the binary: GET / serves these bytes.
// KILN_WEBUI_PATH comes from src/CMakeLists.txt.
    .section .rodata
    .global kiln_webui_begin
    .global kiln_webui_end
kiln_webui_begin:
    .incbin KILN_WEBUI_PATH
kiln_webui_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
