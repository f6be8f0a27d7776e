/* TEMPORARY (branch train only): stand-ins for the module backward that
 * the lead is landing on main; removed by the merge that brings it. */
#include "internal.h"

attn_status attn_module_set_grad_enabled(attn_module *m, bool enabled) {
    (void)m;
    (void)enabled;
    return ATTN_OK;
}
attn_status attn_module_zero_grad(attn_module *m) {
    (void)m;
    return ATTN_OK;
}
attn_status attn_module_backward(attn_module *m, const float *dy, size_t batch, size_t tokens,
                                 float *dx) {
    (void)m; (void)dy; (void)batch; (void)tokens; (void)dx;
    return ATTN_ERR_INVALID;
}
