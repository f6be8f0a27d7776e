/* Placeholder until written. */
typedef int attn_placeholder_src_text_unicode_classes_c;
