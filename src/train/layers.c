/* layers.c — the float32 instantiation of layers_impl.h, the layers the
 * small model runs. */
#include "train/layers.h"

#define REAL float
#define LAYER(name) attn_layer_##name
#define LAYER_API
#include "train/layers_impl.h"
