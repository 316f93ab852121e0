"""The annotated reading of PyTorch's FSDP prefetch code: the notes, as data.

Not one line of torch lives here. Each :class:`Annotation` names a function of the installed
torch (its module and qualified name) and an *anchor*: a few tokens that occur on exactly one
line of that function. :mod:`minigpt.fsdp.reading` finds the line at run time, shows the real
source around it with the file's own line numbers, and prints the note beside it. If an upgrade
of torch renames the function or rewrites the line, ``python -m minigpt.fsdp.reading --check``
and ``tests/test_lab03_reading.py`` fail and name the note, so the reading cannot silently drift
away from the code it explains.

The notes are written for someone who has just built a bucketed DDP by hand (Lab 01): they say
what is prefetched, when, on which stream or ``Work`` handle, and why, in English (``en``) and
Spanish (``es``). The order below is the reading order: FSDP2 forward, FSDP2 backward, the
explicit prefetch API, then FSDP1's prefetch, its recorded execution order and its rate limiter.
Within a function, notes follow the source top to bottom.
"""

from __future__ import annotations

from dataclasses import dataclass

# The modules read, as dotted names (resolved with importlib at run time).
FSDP2_STATE = "torch.distributed.fsdp._fully_shard._fsdp_state"
FSDP2_PARAM_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
FSDP2_API = "torch.distributed.fsdp._fully_shard._fully_shard"
FSDP1_RUNTIME = "torch.distributed.fsdp._runtime_utils"
FSDP1_EXEC_ORDER = "torch.distributed.fsdp._exec_order_utils"
FSDP1_LIMITER = "torch.distributed.fsdp._limiter_utils"


@dataclass(frozen=True)
class Annotation:
    """One note on one line of the installed torch."""

    key: str  # stable id, e.g. "fsdp2.unshard.pending"
    module: str  # dotted module name, e.g. FSDP2_PARAM_GROUP
    qualname: str  # function or method inside the module, e.g. "FSDPParamGroup.unshard"
    anchor: str  # a short exact substring of exactly one line of that function
    en: str
    es: str

    def note(self, lang: str) -> str:
        return self.en if lang == "en" else self.es


@dataclass(frozen=True)
class Section:
    """A group of notes read together, with a title and an introduction in both languages."""

    name: str  # used by --section and as the heading id
    title_en: str
    title_es: str
    intro_en: str
    intro_es: str
    annotations: tuple[Annotation, ...]

    def title(self, lang: str) -> str:
        return self.title_en if lang == "en" else self.title_es

    def intro(self, lang: str) -> str:
        return self.intro_en if lang == "en" else self.intro_es


# --- FSDP2: the forward pass ------------------------------------------------------------------

FSDP2_FORWARD = Section(
    name="fsdp2-forward",
    title_en="FSDP2 (`fully_shard`): the forward pass",
    title_es="FSDP2 (`fully_shard`): la pasada hacia delante",
    intro_en=(
        "`fully_shard(module)` gives a module an `FSDPState` (its hooks) and an `FSDPParamGroup` "
        "(its parameters, stored as dim-0 shards: each rank keeps 1/N of every tensor). The group "
        "plays the role of a bucket in your DDP: one collective moves all of its tensors at once. "
        "But where DDP all-reduces gradients after they are ready, FSDP must all-gather the "
        "parameters before the module can run: the pre-forward hook *unshards* the group, the "
        "compute waits for it, and the post-forward hook *reshards* it (frees the full tensors). "
        "Prefetching means issuing the next group's all-gather early, so that it travels while "
        "the current module computes."
    ),
    intro_es=(
        "`fully_shard(module)` le da a un módulo un `FSDPState` (sus hooks) y un `FSDPParamGroup` "
        "(sus parámetros, guardados como fragmentos en la dimensión 0: cada rank conserva 1/N de "
        "cada tensor). El grupo hace el papel de un bucket de tu DDP: una sola colectiva mueve "
        "todos sus tensores a la vez. Pero donde DDP hace all-reduce de los gradientes cuando ya "
        "están listos, FSDP tiene que hacer all-gather de los parámetros antes de que el módulo "
        "pueda ejecutarse: el hook previo a la pasada hacia delante (forward) reconstruye el grupo "
        "completo (*unshard*), el cómputo lo espera y el hook posterior lo vuelve a fragmentar "
        "(*reshard*, libera los tensores completos). La precarga (prefetch) consiste en lanzar "
        "antes de tiempo el all-gather del grupo siguiente, para que viaje mientras el módulo "
        "actual calcula."
    ),
    annotations=(
        Annotation(
            key="fsdp2.root_pre_forward.wait_for_optimizer",
            module=FSDP2_STATE,
            qualname="FSDPState._root_pre_forward",
            anchor="all_gather_stream.wait_stream(current_stream)",
            en=(
                "Runs once per forward, for the first FSDP module that runs (normally the root). "
                "The all-gather streams are ordered after everything already queued on the compute "
                "stream, above all the optimizer step that has just rewritten the local shards; "
                "without this, the first all-gathers of the step could send stale shards. It orders "
                "GPU streams without stopping the Python thread; on CPU the streams are "
                "placeholders and the call does nothing."
            ),
            es=(
                "Se ejecuta una vez por pasada hacia delante, para el primer módulo FSDP que corre "
                "(normalmente la raíz). Los streams del all-gather quedan ordenados detrás de todo "
                "lo que ya está en cola en el stream de cómputo, sobre todo el paso del optimizador "
                "que acaba de reescribir los fragmentos locales; sin esto, los primeros all-gather "
                "del paso podrían enviar fragmentos viejos. Ordena streams de la GPU sin detener el "
                "hilo de Python; en la CPU los streams son de relleno y la llamada no hace nada."
            ),
        ),
        Annotation(
            key="fsdp2.pre_forward.own_group",
            module=FSDP2_STATE,
            qualname="FSDPState._pre_forward",
            anchor="fsdp_param_group.pre_forward(module, args, kwargs)",
            en=(
                "The module's own parameters come first: `FSDPParamGroup.pre_forward` calls "
                "`unshard()` (issue the all-gather) and then `wait_for_unshard()` (make the "
                "compute wait for it), so the module's forward always sees full parameters. If "
                "an earlier module already prefetched this group, `unshard()` finds the pending "
                "all-gather and returns at once."
            ),
            es=(
                "Primero, los parámetros del propio módulo: `FSDPParamGroup.pre_forward` llama a "
                "`unshard()` (lanza el all-gather) y luego a `wait_for_unshard()` (hace que el "
                "cómputo lo espere), así que la pasada hacia delante del módulo siempre ve los "
                "parámetros completos. Si un módulo anterior ya precargó este grupo, `unshard()` "
                "encuentra el all-gather pendiente y vuelve de inmediato."
            ),
        ),
        Annotation(
            key="fsdp2.pre_forward.explicit_prefetch",
            module=FSDP2_STATE,
            qualname="FSDPState._pre_forward",
            anchor='_prefetch_unshard(target_param_group, "forward")',
            en=(
                "Explicit forward prefetch: the modules you listed with "
                "`set_modules_to_forward_prefetch` (none by default). Their all-gathers are issued "
                "after this module's own wait but before this module computes, so they travel "
                "while it runs. The `state_first_in_pass` guard makes this happen once per state, "
                "even when one `fully_shard([a, b])` call covers several modules."
            ),
            es=(
                "Precarga explícita hacia delante: los módulos que indicaste con "
                "`set_modules_to_forward_prefetch` (ninguno por defecto). Sus all-gather se lanzan "
                "después de la espera del propio módulo pero antes de que este calcule, así que "
                "viajan mientras se ejecuta. La guarda `state_first_in_pass` hace que ocurra una "
                "vez por estado, aunque una sola llamada `fully_shard([a, b])` cubra varios "
                "módulos."
            ),
        ),
        Annotation(
            key="fsdp2.unshard.pending",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.unshard",
            anchor="if self._all_gather_result is not None:",
            en=(
                "This is what makes prefetching safe to repeat: an all-gather that was issued but "
                "not yet waited for is parked in `_all_gather_result`, and a second `unshard()` "
                "returns here. The module's own hook can therefore always call `unshard()`; if a "
                "prefetch got there first, the call is free. The next check returns for the same "
                "reason when the parameters are already full (`reshard_after_forward=False`)."
            ),
            es=(
                "Esto es lo que permite repetir la precarga sin riesgo: un all-gather lanzado pero "
                "todavía no esperado queda guardado en `_all_gather_result`, y un segundo "
                "`unshard()` vuelve aquí. Por eso el hook del propio módulo siempre puede llamar a "
                "`unshard()`; si una precarga llegó antes, la llamada no cuesta nada. La "
                "comprobación siguiente vuelve por la misma razón cuando los parámetros ya están "
                "completos (`reshard_after_forward=False`)."
            ),
        ),
        Annotation(
            key="fsdp2.unshard.streams",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.unshard",
            anchor="get_all_gather_streams(",
            en=(
                "Where the all-gather runs. In forward and pre-backward with the default "
                "`async_op=False`, the copy-in (packing the local shards into one flat buffer) and "
                "the collective go on two side streams: on a GPU they overlap with compute on the "
                "default stream while the CPU moves on, and that is FSDP2's *implicit* prefetch. "
                "With `async_op=True` they go on the current stream and the returned `Work` is "
                "what gets waited on. With gloo on CPU a synchronous all-gather simply blocks the "
                "Python thread until the data has arrived."
            ),
            es=(
                "Dónde corre el all-gather. En la pasada hacia delante y antes de la pasada hacia "
                "atrás, con el `async_op=False` por defecto, la copia de entrada (empaquetar los "
                "fragmentos locales en un búfer plano) y la colectiva van en dos streams laterales: "
                "en una GPU se solapan con el cómputo del stream por defecto mientras la CPU sigue "
                "adelante, y esa es la precarga *implícita* de FSDP2. Con `async_op=True` van en el "
                "stream actual y lo que se espera es el `Work` devuelto. Con gloo en la CPU, un "
                "all-gather síncrono simplemente bloquea el hilo de Python hasta que llegan los "
                "datos."
            ),
        ),
        Annotation(
            key="fsdp2.wait_for_unshard.free_previous",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.wait_for_unshard",
            anchor="prev_all_gather_state := self.comm_ctx.all_gather_state",
            en=(
                "Forward only: the previous group's flat buffer, held over by the lines at the end "
                "of this function, can go now. The all-gather streams first wait for that group's "
                "copy-out event, so no later all-gather can reuse the memory while the copy-out "
                "might still be reading it; then the reference is dropped."
            ),
            es=(
                "Solo en la pasada hacia delante: el búfer plano del grupo anterior, retenido por "
                "las líneas del final de esta función, ya puede soltarse. Primero los streams del "
                "all-gather esperan el evento de la copia de salida de ese grupo, para que ningún "
                "all-gather posterior reutilice la memoria mientras la copia aún podría leerla; "
                "después se suelta la referencia."
            ),
        ),
        Annotation(
            key="fsdp2.wait_for_unshard.copy_out",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.wait_for_unshard",
            anchor="foreach_all_gather_copy_out(",
            en=(
                "The real wait: the copy-out first waits for the all-gather (the compute stream "
                "waits on its event, and for an async op `Work.wait()` is called too), then copies "
                "each parameter's slices out of the flat buffer into its full tensor, which "
                "`_to_unsharded()` then registers on the module. On a GPU this only orders streams; "
                "with gloo, `Work.wait()` blocks the CPU."
            ),
            es=(
                "La espera de verdad: la copia de salida primero espera al all-gather (el stream de "
                "cómputo espera su evento y, si la operación es asíncrona, además se llama a "
                "`Work.wait()`) y "
                "luego copia los trozos de cada parámetro del búfer plano a su tensor completo, que "
                "`_to_unsharded()` registra después en el módulo. En una GPU esto solo ordena "
                "streams; con gloo, `Work.wait()` bloquea la CPU."
            ),
        ),
        Annotation(
            key="fsdp2.wait_for_unshard.defer_free",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.wait_for_unshard",
            anchor="self.comm_ctx.all_gather_state = AllGatherState(",
            en=(
                "Memory of the implicit forward prefetch: in forward (synchronous op, more than one "
                "rank) the flat buffer is not released here but kept with the copy-out event, so "
                "that this copy-out can overlap the next group's all-gather; releasing it now could "
                "let the allocator hand the memory to the all-gather streams while the copy-out "
                "still reads it. The next group's wait releases it (note above), so forward holds "
                "at most one such buffer over."
            ),
            es=(
                "La memoria de la precarga implícita hacia delante: en la pasada hacia delante "
                "(operación síncrona, más de un rank) el búfer plano no se suelta aquí, sino que se "
                "guarda con el evento de la copia de salida, para que esta copia pueda solaparse con "
                "el all-gather del grupo siguiente; soltarlo ahora podría dejar que el asignador de "
                "memoria entregara ese espacio a los streams del all-gather mientras la copia aún lo "
                "lee. La espera del grupo siguiente lo suelta (nota de arriba), así que la pasada "
                "hacia delante retiene como mucho uno de estos búferes."
            ),
        ),
        Annotation(
            key="fsdp2.reshard.after_forward",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.reshard",
            anchor="if not self._reshard_after_forward:",
            en=(
                "`reshard_after_forward` decides what backward costs. `True` (the default for "
                "every module but the root): free the full parameters now and all-gather them again "
                "in backward, the ZeRO-3 trade. `False` (the root's default, set in `_lazy_init`, "
                "since backward starts with the root's layers): keep them and skip the backward "
                "all-gather, ZeRO-2 style for this module. An integer N reshards onto groups of N "
                "ranks, so the backward all-gather stays inside a smaller group such as one node."
            ),
            es=(
                "`reshard_after_forward` decide cuánto cuesta la pasada hacia atrás. `True` (lo "
                "normal en todos los módulos salvo la raíz): liberar ahora los parámetros completos "
                "y volver a hacer all-gather en la pasada hacia atrás, el trato de ZeRO-3. `False` "
                "(lo normal en la raíz, fijado en `_lazy_init`, porque la pasada hacia atrás empieza "
                "por las capas de la raíz): conservarlos y ahorrarse el all-gather de la pasada "
                "hacia atrás, al estilo ZeRO-2 para este módulo. Un entero N vuelve a fragmentar en "
                "grupos de N ranks, para que el all-gather de la pasada hacia atrás se quede dentro "
                "de un grupo más pequeño, por ejemplo un nodo."
            ),
        ),
    ),
)

# --- FSDP2: the backward pass -----------------------------------------------------------------

FSDP2_BACKWARD = Section(
    name="fsdp2-backward",
    title_en="FSDP2: the backward pass",
    title_es="FSDP2: la pasada hacia atrás",
    intro_en=(
        "Backward needs the full parameters again, module by module in reverse order. Two "
        "autograd hooks play the part of your DDP's per-parameter gradient hooks: a hook on each "
        "module's forward output fires just before that module's backward (*pre-backward*: "
        "all-gather its parameters), and an autograd function wrapped around its inputs fires "
        "just after (*post-backward*: free the parameters, reduce-scatter the gradients). Which "
        "module comes next is known because forward recorded the order in which modules finished."
    ),
    intro_es=(
        "La pasada hacia atrás (backward) vuelve a necesitar los parámetros completos, módulo a "
        "módulo y en orden inverso. Dos hooks de autograd hacen el papel de los hooks de gradiente "
        "por parámetro de tu DDP: un hook en la salida de cada módulo se dispara justo antes de la "
        "pasada hacia atrás de ese módulo (*pre-backward*: all-gather de sus parámetros), y una "
        "función de autograd que envuelve sus entradas se dispara justo después (*post-backward*: "
        "liberar los parámetros y hacer reduce-scatter de los gradientes). Se sabe qué módulo "
        "viene después porque la pasada hacia delante registró el orden en que terminaron los "
        "módulos."
    ),
    annotations=(
        Annotation(
            key="fsdp2.post_forward.record_order",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.post_forward",
            anchor="self._record_post_forward()",
            en=(
                "After each forward call the group appends itself to `post_forward_order`, one list "
                "shared by all groups. Backward visits modules in the reverse of this order, so "
                "this is exactly the list the default backward prefetch reads. It is rebuilt every "
                "iteration (and cleared at the end of the last backward), so a forward that changes "
                "from step to step still prefetches the right module."
            ),
            es=(
                "Tras cada llamada hacia delante, el grupo se añade a `post_forward_order`, una "
                "lista compartida por todos los grupos. La pasada hacia atrás recorre los módulos en "
                "el orden inverso, así que esta es justo la lista que lee la precarga por defecto "
                "hacia atrás. Se reconstruye en cada iteración (y se vacía al final de la última "
                "pasada hacia atrás), de modo que una pasada hacia delante que cambia de un paso a "
                "otro sigue precargando el módulo correcto."
            ),
        ),
        Annotation(
            key="fsdp2.pre_backward.default_or_explicit",
            module=FSDP2_STATE,
            qualname="FSDPState._pre_backward",
            anchor="default_prefetch = len(",
            en=(
                "One switch per module: if you called `set_modules_to_backward_prefetch` on it, the "
                "default prefetch (one module back in the recorded order) is off and the loop below "
                "issues your list instead, after this module's own parameters were waited for and "
                "before its gradients are computed."
            ),
            es=(
                "Un interruptor por módulo: si llamaste a `set_modules_to_backward_prefetch` sobre "
                "él, la precarga por defecto (un módulo atrás en el orden registrado) se desactiva y "
                "el bucle de abajo lanza tu lista en su lugar, después de esperar los parámetros del "
                "propio módulo y antes de calcular sus gradientes."
            ),
        ),
        Annotation(
            key="fsdp2.pre_backward.unshard",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.pre_backward",
            anchor="self.unshard(self.unshard_async_op)",
            en=(
                "All-gather this module's parameters for its gradient computation. It costs nothing "
                "when the module was prefetched by the one backward visited before it, or when it "
                "was never resharded (`reshard_after_forward=False`, the root by default)."
            ),
            es=(
                "All-gather de los parámetros de este módulo para calcular sus gradientes. No cuesta "
                "nada si el módulo que la pasada hacia atrás visitó justo antes ya lo precargó, o si "
                "nunca se volvió a fragmentar (`reshard_after_forward=False`, la raíz por defecto)."
            ),
        ),
        Annotation(
            key="fsdp2.pre_backward.default_prefetch",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.pre_backward",
            anchor="self._backward_prefetch()",
            en=(
                "Default backward prefetch, issued after this module's own wait and before autograd "
                "computes its gradients, so the next module's all-gather overlaps this module's "
                "backward compute. It reaches exactly one module ahead, which bounds the extra "
                "memory to one module's full parameters."
            ),
            es=(
                "Precarga por defecto hacia atrás, lanzada después de la espera del propio módulo y "
                "antes de que autograd calcule sus gradientes, así que el all-gather del módulo "
                "siguiente se solapa con el cómputo hacia atrás de este. Llega exactamente un módulo "
                "por delante, lo que limita la memoria extra a los parámetros completos de un solo "
                "módulo."
            ),
        ),
        Annotation(
            key="fsdp2.backward_prefetch.target",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup._backward_prefetch",
            anchor="post_forward_order[curr_index - 1]",
            en=(
                "The target is simply the group that finished its forward just before this one: in "
                "backward it is the next to need its parameters. `curr_index` was popped from "
                "`_post_forward_indices`, one entry per forward call, so a module run twice in one "
                "forward is matched call by call; the first module of the forward (index 0) has "
                "nothing left to prefetch."
            ),
            es=(
                "El objetivo es simplemente el grupo que terminó su pasada hacia delante justo antes "
                "que este: en la pasada hacia atrás es el siguiente que necesitará sus parámetros. "
                "`curr_index` salió de `_post_forward_indices`, con una entrada por llamada, así que "
                "un módulo ejecutado dos veces en una misma pasada se empareja llamada a llamada; el "
                "primer módulo de la pasada (índice 0) ya no tiene nada que precargar."
            ),
        ),
        Annotation(
            key="fsdp2.prefetch_unshard.issue_only",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup._prefetch_unshard",
            anchor="target_fsdp_param_group.unshard(async_op)",
            en=(
                "A prefetch is `unshard()` without `wait_for_unshard()`: the all-gather is issued "
                "and its result parked in the target's `_all_gather_result`; the wait happens later, "
                "in the target's own pre-forward or pre-backward hook. The `use_training_state` "
                "context above lends the target the state of the pass it is prefetched for, so "
                "`unshard()` picks the right streams."
            ),
            es=(
                "Una precarga es `unshard()` sin `wait_for_unshard()`: el all-gather se lanza y su "
                "resultado queda guardado en `_all_gather_result` del grupo objetivo; la espera llega "
                "después, en el propio hook previo (hacia delante o hacia atrás) del objetivo. El "
                "contexto `use_training_state` de arriba le presta al objetivo el estado de la "
                "pasada para la que se precarga, para que `unshard()` elija los streams correctos."
            ),
        ),
        Annotation(
            key="fsdp2.post_backward.reduce_scatter",
            module=FSDP2_PARAM_GROUP,
            qualname="FSDPParamGroup.post_backward",
            anchor="= foreach_reduce(",
            en=(
                "The gradient side, the closest thing to your bucketed DDP: the group's unsharded "
                "gradients are packed into one buffer and reduce-scattered on the reduce-scatter "
                "stream, so each rank receives the reduced (by default averaged) gradient of its own "
                "shard only. A few lines above, `reshard()` already freed the full parameters; the "
                "reduction runs while autograd moves on to the previous module."
            ),
            es=(
                "El lado de los gradientes, lo más parecido a tu DDP con buckets: los gradientes "
                "completos del grupo se empaquetan en un búfer y se les hace reduce-scatter en el "
                "stream de reduce-scatter, de modo que cada rank recibe el gradiente reducido (por "
                "defecto, promediado) solo de su fragmento. Unas líneas más arriba, `reshard()` ya "
                "liberó los parámetros completos; la reducción corre mientras autograd pasa al "
                "módulo anterior."
            ),
        ),
    ),
)

# --- FSDP2: the explicit prefetch API ---------------------------------------------------------

FSDP2_EXPLICIT = Section(
    name="fsdp2-explicit",
    title_en="FSDP2: the explicit prefetch API",
    title_es="FSDP2: la API de precarga explícita",
    intro_en=(
        "The defaults prefetch one module ahead in backward and, in forward, rely on side streams "
        "(the implicit prefetch). These `FSDPModule` methods let you decide instead: which modules "
        "to prefetch, how many ahead, and whether the hooks' all-gathers return a `Work` to wait "
        "on. More all-gathers in flight give more overlap and cost more memory: every prefetched "
        "module holds its full parameters until it has run."
    ),
    intro_es=(
        "Por defecto se precarga un módulo por delante en la pasada hacia atrás y, en la pasada "
        "hacia delante, se confía en los streams laterales (la precarga implícita). Estos métodos "
        "de `FSDPModule` te dejan decidir: qué módulos precargar, cuántos por delante y si los "
        "all-gather de los hooks devuelven un `Work` que esperar. Más all-gather en vuelo dan más "
        "solapamiento y cuestan más memoria: cada módulo precargado retiene sus parámetros "
        "completos hasta que se ejecuta."
    ),
    annotations=(
        Annotation(
            key="api.set_modules_to_forward_prefetch",
            module=FSDP2_API,
            qualname="FSDPModule.set_modules_to_forward_prefetch",
            anchor="_states_to_forward_prefetch = [",
            en=(
                "It only stores the targets' states; the work happens in `FSDPState._pre_forward` "
                "(first section). A list of two or more, e.g. "
                "`layers[i].set_modules_to_forward_prefetch([layers[i + 1], layers[i + 2]])`, is "
                "the way to keep more than one all-gather ahead of the compute, at the price of "
                "more memory."
            ),
            es=(
                "Solo guarda los estados de los objetivos; el trabajo ocurre en "
                "`FSDPState._pre_forward` (primera sección). Una lista de dos o más, por ejemplo "
                "`layers[i].set_modules_to_forward_prefetch([layers[i + 1], layers[i + 2]])`, es "
                "la manera de tener más de un all-gather por delante del cómputo, a cambio de más "
                "memoria."
            ),
        ),
        Annotation(
            key="api.set_modules_to_backward_prefetch",
            module=FSDP2_API,
            qualname="FSDPModule.set_modules_to_backward_prefetch",
            anchor="_states_to_backward_prefetch = [",
            en=(
                "Also only stored; `FSDPState._pre_backward` reads it, and a non-empty list turns "
                "off the recorded-order prefetch for this module. In backward the targets are "
                "earlier layers: `layers[i].set_modules_to_backward_prefetch([layers[i - 1]])` "
                "reproduces the default, a longer list prefetches deeper."
            ),
            es=(
                "También solo se guarda; lo lee `FSDPState._pre_backward`, y una lista no vacía "
                "desactiva para este módulo la precarga según el orden registrado. En la pasada "
                "hacia atrás los objetivos son capas anteriores: "
                "`layers[i].set_modules_to_backward_prefetch([layers[i - 1]])` reproduce el "
                "comportamiento por defecto, y una lista más larga precarga más lejos."
            ),
        ),
        Annotation(
            key="api.unshard",
            module=FSDP2_API,
            qualname="FSDPModule.unshard",
            anchor="fsdp_param_group.unshard(async_op=async_op)",
            en=(
                "Manual prefetch from your own loop, for example to start the first layer's "
                "all-gather before the model is even called. With `async_op=True` you get an "
                "`UnshardHandle` back, but you rarely need to wait on it: the module's pre-forward "
                "hook waits for the pending all-gather anyway."
            ),
            es=(
                "Precarga manual desde tu propio bucle, por ejemplo para empezar el all-gather de la "
                "primera capa antes incluso de llamar al modelo. Con `async_op=True` recibes un "
                "`UnshardHandle`, pero rara vez hace falta esperarlo: el hook previo a la pasada "
                "hacia delante del módulo espera de todos modos el all-gather pendiente."
            ),
        ),
        Annotation(
            key="api.set_unshard_async_op",
            module=FSDP2_API,
            qualname="FSDPModule._set_unshard_async_op",
            anchor="fsdp_param_group.unshard_async_op = async_op",
            en=(
                "A private switch (note the underscore) for the hooks' own all-gathers: `True` puts "
                "them on the current stream with a `Work` to wait on, instead of the side streams. "
                "On a GPU you then get overlap only from explicit prefetching. With gloo on CPU it "
                "is the other way round: a synchronous all-gather blocks the Python thread, so only "
                "an async one can run in the background while the next module computes."
            ),
            es=(
                "Un interruptor privado (fíjate en el guion bajo) para los all-gather de los propios "
                "hooks: `True` los pone en el stream actual con un `Work` que esperar, en lugar de "
                "los streams laterales. En una GPU, entonces, solo hay solapamiento con precarga "
                "explícita. Con gloo en la CPU es al revés: un all-gather síncrono bloquea el hilo "
                "de Python, así que solo uno asíncrono puede correr de fondo mientras el módulo "
                "siguiente calcula."
            ),
        ),
    ),
)

# --- FSDP1: prefetching -----------------------------------------------------------------------

FSDP1_PREFETCH = Section(
    name="fsdp1-prefetch",
    title_en="FSDP1 (`FullyShardedDataParallel`): prefetching",
    title_es="FSDP1 (`FullyShardedDataParallel`): la precarga",
    intro_en=(
        "FSDP1 flattens each wrapped unit's parameters into one `FlatParameter`, managed by a "
        "`FlatParamHandle`; its runtime is a set of free functions taking `(state, handle)`, and "
        "every all-gather goes on one unshard stream shared by all units. A prefetch here is an "
        "`_unshard()` issued early plus a `_prefetched` flag on the handle. Forward prefetch is off "
        "by default (`forward_prefetch=False`); backward prefetch comes in two flavours, "
        "`BackwardPrefetch.BACKWARD_PRE` (the default) and `BACKWARD_POST`, which differ only in "
        "which hook issues it."
    ),
    intro_es=(
        "FSDP1 aplana los parámetros de cada unidad envuelta en un solo `FlatParameter` (parámetro "
        "plano), gestionado por un `FlatParamHandle`; su motor son funciones sueltas que reciben "
        "`(state, handle)`, y todos los all-gather van en un único stream de unshard compartido por "
        "todas las unidades. Aquí una precarga es un `_unshard()` lanzado antes de tiempo más una "
        "marca `_prefetched` en el handle. La precarga hacia delante está desactivada por defecto "
        "(`forward_prefetch=False`); la precarga hacia atrás tiene dos variantes, "
        "`BackwardPrefetch.BACKWARD_PRE` (la predeterminada) y `BACKWARD_POST`, que solo se "
        "diferencian en qué hook la lanza."
    ),
    annotations=(
        Annotation(
            key="fsdp1.pre_forward_unshard.skip_if_prefetched",
            module=FSDP1_RUNTIME,
            qualname="_pre_forward_unshard",
            anchor="if not handle._prefetched:",
            en=(
                "The receiving end of a prefetch: a handle that an earlier unit already all-gathered "
                "is not all-gathered again, only waited for a few lines below. The flag returns to "
                "`False` whenever the handle is resharded."
            ),
            es=(
                "El extremo receptor de una precarga: un handle al que una unidad anterior ya le "
                "hizo all-gather no se vuelve a reunir, solo se espera unas líneas más abajo. La "
                "marca vuelve a `False` cada vez que el handle se fragmenta de nuevo."
            ),
        ),
        Annotation(
            key="fsdp1.pre_forward_unshard.forward_prefetch",
            module=FSDP1_RUNTIME,
            qualname="_pre_forward_unshard",
            anchor="_prefetch_handle(state, handle, _PrefetchMode.FORWARD)",
            en=(
                "Forward prefetch is attempted here, once the compute stream has been told to wait "
                "for this unit's all-gather and before its forward runs; it does nothing unless the "
                "model was wrapped with `forward_prefetch=True`. PyTorch recommends it only for "
                "CPU-bound runs, where the CPU cannot get far enough ahead of the GPU to issue the "
                "next all-gather early on its own."
            ),
            es=(
                "Aquí se intenta la precarga hacia delante, una vez que se le indicó al stream de "
                "cómputo que espere el all-gather de esta unidad y antes de que se ejecute su pasada "
                "hacia delante; no hace nada salvo que el modelo se haya envuelto con "
                "`forward_prefetch=True`. PyTorch la recomienda solo cuando el cuello de botella es "
                "la CPU, que entonces no logra adelantarse lo bastante a la GPU para lanzar por sí "
                "sola el siguiente all-gather a tiempo."
            ),
        ),
        Annotation(
            key="fsdp1.pre_backward_hook.backward_pre",
            module=FSDP1_RUNTIME,
            qualname="_pre_backward_hook",
            anchor="_prefetch_handle(state, handle, _PrefetchMode.BACKWARD)",
            en=(
                "Where `BACKWARD_PRE` acts: in the pre-backward hook, once this handle's own "
                "all-gather has been issued and waited for, and before its gradients are computed. "
                "The next all-gather overlaps this "
                "unit's gradient computation; at the peak, memory holds this unit's parameters, the "
                "next unit's parameters and this unit's gradients."
            ),
            es=(
                "Donde actúa `BACKWARD_PRE`: en el hook previo a la pasada hacia atrás, una vez "
                "lanzado y esperado el all-gather del propio handle, y antes de calcular sus "
                "gradientes. El "
                "siguiente all-gather se solapa con el cálculo de gradientes de esta unidad; en el "
                "pico, la memoria contiene los parámetros de esta unidad, los de la siguiente y los "
                "gradientes de esta."
            ),
        ),
        Annotation(
            key="fsdp1.post_backward_reshard.backward_post",
            module=FSDP1_RUNTIME,
            qualname="_post_backward_reshard",
            anchor="_prefetch_handle(state, handle, _PrefetchMode.BACKWARD)",
            en=(
                "Where `BACKWARD_POST` acts: after this unit's gradients exist and its full "
                "parameters were freed by `_reshard` just above. The all-gather no longer overlaps "
                "this unit's gradient computation, but the peak is lower: this unit's parameters "
                "are gone before the next unit's arrive."
            ),
            es=(
                "Donde actúa `BACKWARD_POST`: cuando los gradientes de esta unidad ya existen y "
                "`_reshard`, justo arriba, ya liberó sus parámetros completos. El all-gather ya no "
                "se solapa con el cálculo de gradientes de esta unidad, pero el pico es menor: los "
                "parámetros de esta unidad desaparecen antes de que lleguen los de la siguiente."
            ),
        ),
        Annotation(
            key="fsdp1.prefetch_handle.flag",
            module=FSDP1_RUNTIME,
            qualname="_prefetch_handle",
            anchor="handle._prefetched = True",
            en=(
                "A prefetch is a plain `_unshard()` on the shared unshard stream with no wait at "
                "all, followed by this flag so that the target's own hook does not all-gather a "
                "second time; the wait is left to the target's hook, as late as possible. The "
                "handle's training state is faked during the call so its unsharded views are "
                "built for the right pass."
            ),
            es=(
                "Una precarga es un `_unshard()` normal en el stream de unshard compartido, sin "
                "ninguna espera, seguido de esta marca para que el propio hook del objetivo no haga "
                "un segundo all-gather; la espera queda para ese hook, lo más tarde posible. Durante "
                "la llamada se finge el estado de entrenamiento del handle para que sus vistas "
                "completas se construyan para la pasada correcta."
            ),
        ),
        Annotation(
            key="fsdp1.get_handle_to_prefetch.mode",
            module=FSDP1_RUNTIME,
            qualname="_get_handle_to_prefetch",
            anchor="state.backward_prefetch == BackwardPrefetch.BACKWARD_PRE",
            en=(
                "Both hooks ask for a backward prefetch and this condition lets only one of them "
                "act: the pre-backward call under `BACKWARD_PRE`, the post-backward call under "
                "`BACKWARD_POST`. With `backward_prefetch=None` neither does, and backward has no "
                "communication/computation overlap at all. Just below, a candidate is also skipped "
                "if it was already prefetched."
            ),
            es=(
                "Los dos hooks piden una precarga hacia atrás y esta condición deja actuar solo a "
                "uno: la llamada previa con `BACKWARD_PRE`, la posterior con `BACKWARD_POST`. Con "
                "`backward_prefetch=None` no actúa ninguna y la pasada hacia atrás no tiene ningún "
                "solapamiento entre comunicación y cómputo. Justo debajo, además, se descarta un "
                "candidato que ya fue precargado."
            ),
        ),
    ),
)

# --- FSDP1: the recorded execution order ------------------------------------------------------

FSDP1_EXEC_ORDER_SECTION = Section(
    name="fsdp1-exec-order",
    title_en="FSDP1: the recorded execution order",
    title_es="FSDP1: el orden de ejecución registrado",
    intro_en=(
        "A hook only knows the module it runs for; to prefetch the *next* unit, FSDP1 needs to "
        "know the order. `_ExecOrderData`, one object shared by all units under a root, records "
        "two lists: the pre-forward order, recorded on the first iteration only and then frozen "
        "(forward prefetch and the order check read it), and the post-forward order, recorded "
        "again every iteration (backward prefetch reads it backwards). Freezing is cheap and right "
        "for a static model; if the forward order changes later, forward prefetch all-gathers the "
        "wrong unit early while the unit that really runs next waits for its own all-gather. "
        "FSDP2 keeps no first-iteration order at all."
    ),
    intro_es=(
        "Un hook solo conoce el módulo para el que se ejecuta; para precargar la unidad "
        "*siguiente*, FSDP1 necesita conocer el orden. `_ExecOrderData`, un único objeto "
        "compartido por todas las unidades bajo una raíz, registra dos listas: el orden previo a "
        "la pasada hacia delante, registrado solo en la primera iteración y luego congelado (lo "
        "leen la precarga hacia delante y la comprobación de orden), y el orden posterior a la "
        "pasada hacia delante, registrado de nuevo en cada iteración (la precarga hacia atrás lo "
        "lee al revés). Congelarlo es barato y correcto para un modelo estático; si más tarde "
        "cambia el orden, la precarga hacia delante reúne antes de tiempo la unidad equivocada "
        "mientras la que de verdad se ejecuta después espera su propio all-gather. FSDP2 no guarda "
        "ningún orden de la primera iteración."
    ),
    annotations=(
        Annotation(
            key="fsdp1.record_pre_forward.first_iter_only",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData.record_pre_forward",
            anchor="if not self.is_first_iter",
            en=(
                "Called from every unit's `_pre_forward`. On the first iteration each unit appends "
                "itself once and keeps its position in `_pre_forward_order_index`; from the second "
                "iteration on this returns at once, so the order is frozen. Finding \"the unit after "
                "me\" is then a list lookup, at the price of assuming every step runs the same units "
                "in the same order."
            ),
            es=(
                "Se llama desde `_pre_forward` de cada unidad. En la primera iteración cada unidad "
                "se añade una vez y guarda su posición en `_pre_forward_order_index`; desde la "
                "segunda iteración esto vuelve de inmediato, así que el orden queda congelado. "
                "Encontrar \"la unidad que va después de mí\" es entonces una consulta a una lista, "
                "a cambio de suponer que cada paso ejecuta las mismas unidades en el mismo orden."
            ),
        ),
        Annotation(
            key="fsdp1.exec_order.backward_target",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData.get_handle_to_backward_prefetch",
            anchor="target_index = current_index - 1",
            en=(
                "Backward prefetch reads the post-forward order, which `record_post_forward` "
                "rebuilds every iteration: the target is the unit that finished forward just before "
                "the current one, the next one backward reaches. The FSDP constructor fixes "
                "`backward_prefetch_limit` to 1, so the loop below takes exactly one step back."
            ),
            es=(
                "La precarga hacia atrás lee el orden posterior a la pasada hacia delante, que "
                "`record_post_forward` reconstruye en cada iteración: el objetivo es la unidad que "
                "terminó justo antes que la actual, la siguiente a la que llega la pasada hacia "
                "atrás. El constructor de FSDP fija `backward_prefetch_limit` en 1, así que el bucle "
                "de abajo retrocede exactamente un paso."
            ),
        ),
        Annotation(
            key="fsdp1.exec_order.forward_target",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData.get_handle_to_forward_prefetch",
            anchor="target_index = current_index + 1",
            en=(
                "Forward prefetch reads the frozen first-iteration order: the target is whichever "
                "unit ran right after this one back then. If another unit runs next now, the wrong "
                "parameters are all-gathered early and held until used (or until the catch-all "
                "reshard at the end of backward), and the unit that really runs next is all-gathered "
                "late, with no overlap."
            ),
            es=(
                "La precarga hacia delante lee el orden congelado de la primera iteración: el "
                "objetivo es la unidad que entonces se ejecutó justo después de esta. Si ahora se "
                "ejecuta otra, se reúnen antes de tiempo los parámetros equivocados y se retienen "
                "hasta que se usan (o hasta el reshard de rescate al final de la pasada hacia "
                "atrás), y la unidad que de verdad va después recibe su all-gather tarde, sin "
                "solapamiento."
            ),
        ),
        Annotation(
            key="fsdp1.check_order.across_ranks",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData._check_order",
            anchor="Forward order differs across ranks:",
            en=(
                "Only with `TORCH_DISTRIBUTED_DEBUG=DETAIL`. On the first iteration each unit's "
                "index is all-gathered, so every rank can check that all ranks are about to "
                "all-gather the same `FlatParameter`; a mismatch becomes an error here instead of a "
                "hang or mixed-up data in the real all-gather. Two extra collectives per unit is why "
                "this is a debug mode."
            ),
            es=(
                "Solo con `TORCH_DISTRIBUTED_DEBUG=DETAIL`. En la primera iteración se hace "
                "all-gather del índice de cada unidad, así cada rank comprueba que todos van a hacer "
                "all-gather del mismo `FlatParameter`; una discrepancia se convierte aquí en un "
                "error en lugar de un bloqueo (hang) o de datos mezclados en el all-gather real. Dos "
                "colectivas extra por unidad explican que sea un modo de depuración."
            ),
        ),
        Annotation(
            key="fsdp1.check_order.later_iterations",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData._check_order",
            anchor="Forward order differs from that of the first",
            en=(
                "Later iterations only compare each rank with its own first-iteration order, with no "
                "communication, and warn on the first deviating iteration only. The warning matters "
                "twice: the frozen order now misleads forward prefetch, and if ranks deviate in "
                "different ways their collectives no longer pair up."
            ),
            es=(
                "Las iteraciones siguientes solo comparan cada rank con su propio orden de la "
                "primera iteración, sin comunicación, y avisan únicamente en la primera iteración "
                "que se desvía. El aviso importa por dos razones: el orden congelado ya engaña a la "
                "precarga hacia delante, y si los ranks se desvían de formas distintas sus "
                "colectivas dejan de emparejarse."
            ),
        ),
        Annotation(
            key="fsdp1.exec_order.next_iter",
            module=FSDP1_EXEC_ORDER,
            qualname="_ExecOrderData.next_iter",
            anchor="self._iter += 1",
            en=(
                "Called from the root's `_post_backward_final_callback`: the end of backward is the "
                "end of an iteration. Moving `_iter` past 0 is what freezes the pre-forward order; "
                "the post-forward order is cleared on the next line, to be recorded again."
            ),
            es=(
                "Se llama desde `_post_backward_final_callback` de la raíz: el final de la pasada "
                "hacia atrás es el final de una iteración. Que `_iter` deje de valer 0 es lo que "
                "congela el orden previo a la pasada hacia delante; el orden posterior se vacía en "
                "la línea siguiente, para registrarlo otra vez."
            ),
        ),
    ),
)

# --- FSDP1: the rate limiter ------------------------------------------------------------------

FSDP1_RATE_LIMITER = Section(
    name="fsdp1-rate-limiter",
    title_en="FSDP1: the rate limiter (`limit_all_gathers`)",
    title_es="FSDP1: el limitador de ritmo (`limit_all_gathers`)",
    intro_en=(
        "The CPU thread that issues GPU work usually runs far ahead of the GPU. Every all-gather "
        "allocates a unit's full parameters when it is issued, but a finished unit's memory can "
        "only be reused once the GPU has actually reached its free. Left alone, the CPU could "
        "issue the all-gathers of many units ahead and hold all their full parameters at once, "
        "which is the very memory FSDP exists to save. With `limit_all_gathers=True` (the "
        "default) the CPU stops whenever two units' frees are still pending on the GPU."
    ),
    intro_es=(
        "El hilo de la CPU que lanza el trabajo de la GPU suele ir muy por delante de la GPU. Cada "
        "all-gather reserva los parámetros completos de una unidad en el momento de lanzarse, pero "
        "la memoria de una unidad terminada solo se puede reutilizar cuando la GPU llega de verdad "
        "a su liberación. Sin freno, la CPU podría lanzar los all-gather de muchas unidades por "
        "delante y retener a la vez todos sus parámetros completos, justo la memoria que FSDP "
        "existe para ahorrar. Con `limit_all_gathers=True` (el valor por defecto), el limitador de "
        "ritmo (rate limiter) detiene la CPU mientras haya dos liberaciones pendientes en la GPU."
    ),
    annotations=(
        Annotation(
            key="fsdp1.limiter.two_in_flight",
            module=FSDP1_LIMITER,
            qualname="_FreeEventQueue.__init__",
            anchor="self._max_num_inflight_all_gathers = 2",
            en=(
                "Two units' worth of full parameters: the one computing now and the next one, "
                "prefetched. That is what the default one-ahead prefetch needs and no more. The "
                "number is fixed in the code (the comment calls it empirical), not a constructor "
                "argument."
            ),
            es=(
                "Los parámetros completos de dos unidades: la que calcula ahora y la siguiente, "
                "precargada. Es lo que necesita la precarga por defecto de una unidad por delante, "
                "y nada más. El número está fijado en el código (el comentario lo llama empírico), "
                "no es un argumento del constructor."
            ),
        ),
        Annotation(
            key="fsdp1.limiter.enqueue_on_free",
            module=FSDP1_RUNTIME,
            qualname="_reshard",
            anchor="state._free_event_queue.enqueue(free_event)",
            en=(
                "Each free of a unit's full flat parameter records an event on the compute stream "
                "and queues it; the event completes when the GPU has passed that point, so the "
                "memory can really be reused. Only frees are counted: a unit that keeps its full "
                "parameters after forward (the root, or any unit under `SHARD_GRAD_OP`) adds "
                "nothing to the queue at that point."
            ),
            es=(
                "Cada liberación del parámetro plano completo de una unidad registra un evento en el "
                "stream de cómputo y lo pone en la cola; el evento se completa cuando la GPU pasa "
                "por ese punto, y solo entonces la memoria se puede reutilizar. Solo cuentan las "
                "liberaciones: una unidad que conserva sus parámetros completos tras la pasada hacia "
                "delante (la raíz, o cualquier unidad con `SHARD_GRAD_OP`) no añade nada a la cola "
                "en ese momento."
            ),
        ),
        Annotation(
            key="fsdp1.limiter.synchronize",
            module=FSDP1_RUNTIME,
            qualname="_unshard",
            anchor="event.synchronize()",
            en=(
                "The limiter itself: before issuing an all-gather, if two free events are queued, "
                "the oldest is taken off and the CPU blocks until the GPU has passed it (at once if "
                "it already has). The GPU does not slow down, "
                "it still has the queued work in front of it; only the CPU is kept from allocating a "
                "third unit's parameters. In a profile this is the `rate_limiter` gap the FSDP docs "
                "warn about; on CPU the event is a stub and never waits."
            ),
            es=(
                "El limitador en sí: antes de lanzar un all-gather, si hay dos eventos de "
                "liberación en la cola, se saca el más antiguo y la CPU se bloquea hasta que la GPU "
                "lo pasa (al instante si ya lo pasó). La GPU no se "
                "frena, todavía tiene delante el trabajo en cola; solo se impide que la CPU reserve "
                "los parámetros de una tercera unidad. En un perfil es el hueco `rate_limiter` del "
                "que avisa la documentación de FSDP; en la CPU el evento es de relleno y nunca "
                "espera."
            ),
        ),
    ),
)

SECTIONS: tuple[Section, ...] = (
    FSDP2_FORWARD,
    FSDP2_BACKWARD,
    FSDP2_EXPLICIT,
    FSDP1_PREFETCH,
    FSDP1_EXEC_ORDER_SECTION,
    FSDP1_RATE_LIMITER,
)

ANNOTATIONS: tuple[Annotation, ...] = tuple(a for section in SECTIONS for a in section.annotations)
