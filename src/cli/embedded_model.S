// The default model (models/kiln-demo.gguf) linked into the kiln binary, so `kiln run` works offline with no -m.
// Built only when the file exists; KILN_DEMO_MODEL_PATH comes from src/CMakeLists.txt.
    .section .rodata
    .global kiln_embedded_model_begin
    .global kiln_embedded_model_end
    .balign 64
kiln_embedded_model_begin:
    .incbin KILN_DEMO_MODEL_PATH
kiln_embedded_model_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
