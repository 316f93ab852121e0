"""The words of the tutor's small grammar, their forms, and the rules that pick a form.

Spanish: regular -ar/-er/-ir verbs in the present and the preterite, nouns with gender and
number, definite and indefinite articles. English: verbs in the present (with the -s of
he/she) and the simple past, nouns with number, determiners that agree with their noun
(a/an, this/these, that/those). Every verb takes objects from a few noun categories, so the
sentences make sense ("comer una manzana", not "comer una ventana").

Persons are numbered 0..5: yo/I, tú/you, él/ella/usted/he/she, nosotros/we, vosotros,
ellos/ellas/ustedes/they. :mod:`minigpt.grammar` builds the corpus from these tables.
"""

from __future__ import annotations

# Spanish tables
# Persons are indexed 0..5: yo, tú, él/ella/usted, nosotros, vosotros, ellos/ellas/ustedes.

ES_PRONOUNS = {
    "yo": 0,
    "tú": 1,
    "él": 2,
    "ella": 2,
    "usted": 2,
    "nosotros": 3,
    "nosotras": 3,
    "vosotros": 4,
    "vosotras": 4,
    "ellos": 5,
    "ellas": 5,
    "ustedes": 5,
}
ES_ENDINGS = {  # (present, preterite) endings for the six persons of a regular verb
    "ar": (("o", "as", "a", "amos", "áis", "an"), ("é", "aste", "ó", "amos", "asteis", "aron")),
    "er": (("o", "es", "e", "emos", "éis", "en"), ("í", "iste", "ió", "imos", "isteis", "ieron")),
    "ir": (("o", "es", "e", "imos", "ís", "en"), ("í", "iste", "ió", "imos", "isteis", "ieron")),
}
# "hoy" is left out on purpose: Spanish allows it with the present and the preterite alike
# ("hoy lavo", "hoy lavé"), so it cannot decide which tense is right.
ES_ADVERBS = {"normalmente": "present", "siempre": "present", "ahora": "present", "ayer": "past", "anoche": "past"}
# Nouns: category -> [(singular, plural, gender)]
ES_NOUNS = {
    "food": [
        ("manzana", "manzanas", "f"),
        ("pastel", "pasteles", "m"),
        ("sopa", "sopas", "f"),
        ("tomate", "tomates", "m"),
        ("galleta", "galletas", "f"),
        ("pescado", "pescados", "m"),
        ("naranja", "naranjas", "f"),
        ("huevo", "huevos", "m"),
    ],
    "drink": [
        ("café", "cafés", "m"),
        ("jugo", "jugos", "m"),
        ("limonada", "limonadas", "f"),
        ("té", "tés", "m"),
        ("cerveza", "cervezas", "f"),
    ],
    "text": [
        ("libro", "libros", "m"),
        ("carta", "cartas", "f"),
        ("revista", "revistas", "f"),
        ("periódico", "periódicos", "m"),
        ("mensaje", "mensajes", "m"),
        ("novela", "novelas", "f"),
        ("poema", "poemas", "m"),
    ],
    "music": [("canción", "canciones", "f"), ("tango", "tangos", "m"), ("himno", "himnos", "m")],
    "thing": [
        ("puerta", "puertas", "f"),
        ("ventana", "ventanas", "f"),
        ("caja", "cajas", "f"),
        ("coche", "coches", "m"),
        ("bicicleta", "bicicletas", "f"),
        ("mesa", "mesas", "f"),
        ("plato", "platos", "m"),
        ("camisa", "camisas", "f"),
        ("vaso", "vasos", "m"),
    ],
    "place": [
        ("ciudad", "ciudades", "f"),
        ("museo", "museos", "m"),
        ("parque", "parques", "m"),
        ("playa", "playas", "f"),
        ("país", "países", "m"),
    ],
    "person": [
        ("perro", "perros", "m"),
        ("gata", "gatas", "f"),
        ("niño", "niños", "m"),
        ("niña", "niñas", "f"),
        ("profesor", "profesores", "m"),
        ("profesora", "profesoras", "f"),
        ("vecino", "vecinos", "m"),
        ("vecina", "vecinas", "f"),
        ("hermano", "hermanos", "m"),
        ("hermana", "hermanas", "f"),
    ],
}
ES_LANGUAGES = ["español", "inglés", "francés", "alemán", "italiano", "portugués"]
ES_ARTICLES = {  # (definite, gender, plural) -> article
    (True, "m", False): "el",
    (True, "f", False): "la",
    (True, "m", True): "los",
    (True, "f", True): "las",
    (False, "m", False): "un",
    (False, "f", False): "una",
    (False, "m", True): "unos",
    (False, "f", True): "unas",
}
# Verb infinitive -> the object categories it takes ("language" means a bare language name).
ES_VERBS = {
    "hablar": ["language"],
    "estudiar": ["language", "text"],
    "cantar": ["music"],
    "escuchar": ["music"],
    "comprar": ["food", "drink", "thing", "text"],
    "cocinar": ["food"],
    "preparar": ["food", "drink"],
    "tomar": ["drink"],
    "mirar": ["thing", "place"],
    "visitar": ["place"],
    "lavar": ["thing"],
    "usar": ["thing"],
    "pintar": ["thing"],
    "limpiar": ["thing", "place"],
    "llevar": ["thing", "food"],
    "comer": ["food"],
    "beber": ["drink"],
    "aprender": ["language"],
    "vender": ["food", "thing", "text"],
    "romper": ["thing"],
    "comprender": ["text", "language"],
    "escribir": ["text"],
    "abrir": ["thing", "text"],
    "compartir": ["food", "drink"],
    "recibir": ["text"],
    "describir": ["place", "thing"],
}

# ----------------------------------------------------------------------------------------------
# English tables. Persons as above; "you" is 1 and also plural 4, "it" is not used.

EN_PRONOUNS = {"I": 0, "you": 1, "he": 2, "she": 2, "we": 3, "they": 5}
EN_ADVERBS = {
    "every day": "present",
    "usually": "present",
    "often": "present",
    "yesterday": "past",
    "last night": "past",
    "last week": "past",
}
EN_NOUNS = {  # category -> [(singular, plural)]
    "food": [
        ("apple", "apples"),
        ("cake", "cakes"),
        ("soup", "soups"),
        ("orange", "oranges"),
        ("egg", "eggs"),
        ("sandwich", "sandwiches"),
        ("banana", "bananas"),
        ("cookie", "cookies"),
        ("tomato", "tomatoes"),
    ],
    "drink": [("coffee", "coffees"), ("juice", "juices"), ("tea", "teas"), ("lemonade", "lemonades")],
    "text": [
        ("book", "books"),
        ("letter", "letters"),
        ("email", "emails"),
        ("article", "articles"),
        ("novel", "novels"),
        ("poem", "poems"),
        ("message", "messages"),
    ],
    "music": [("song", "songs"), ("album", "albums"), ("anthem", "anthems")],
    "thing": [
        ("door", "doors"),
        ("window", "windows"),
        ("box", "boxes"),
        ("car", "cars"),
        ("bike", "bikes"),
        ("table", "tables"),
        ("plate", "plates"),
        ("shirt", "shirts"),
        ("umbrella", "umbrellas"),
        ("glass", "glasses"),
    ],
    "place": [
        ("city", "cities"),
        ("museum", "museums"),
        ("park", "parks"),
        ("beach", "beaches"),
        ("office", "offices"),
    ],
    "person": [
        ("dog", "dogs"),
        ("cat", "cats"),
        ("teacher", "teachers"),
        ("student", "students"),
        ("neighbor", "neighbors"),
        ("sister", "sisters"),
        ("brother", "brothers"),
        ("friend", "friends"),
        ("artist", "artists"),
        ("uncle", "uncles"),
    ],
}
EN_LANGUAGES = ["English", "Spanish", "French", "German", "Italian", "Portuguese"]
# Verb -> ((base, third person singular, past), object categories). None has past == base.
EN_VERBS = {
    "speak": (("speak", "speaks", "spoke"), ["language"]),
    "learn": (("learn", "learns", "learned"), ["language"]),
    "study": (("study", "studies", "studied"), ["language", "text"]),
    "sing": (("sing", "sings", "sang"), ["music"]),
    "hear": (("hear", "hears", "heard"), ["music"]),
    "buy": (("buy", "buys", "bought"), ["food", "drink", "thing", "text"]),
    "cook": (("cook", "cooks", "cooked"), ["food"]),
    "make": (("make", "makes", "made"), ["food", "drink"]),
    "drink": (("drink", "drinks", "drank"), ["drink"]),
    "visit": (("visit", "visits", "visited"), ["place"]),
    "wash": (("wash", "washes", "washed"), ["thing"]),
    "paint": (("paint", "paints", "painted"), ["thing"]),
    "clean": (("clean", "cleans", "cleaned"), ["thing", "place"]),
    "carry": (("carry", "carries", "carried"), ["thing", "food"]),
    "eat": (("eat", "eats", "ate"), ["food"]),
    "sell": (("sell", "sells", "sold"), ["food", "thing", "text"]),
    "break": (("break", "breaks", "broke"), ["thing"]),
    "write": (("write", "writes", "wrote"), ["text"]),
    "open": (("open", "opens", "opened"), ["thing", "text"]),
    "share": (("share", "shares", "shared"), ["food", "drink"]),
    "send": (("send", "sends", "sent"), ["text"]),
    "describe": (("describe", "describes", "described"), ["place", "thing"]),
}
EN_DETERMINERS = ("the", "my", "a", "an", "this", "that", "these", "those")
EN_VOWEL_SOUND = set("aeiou")  # every noun above is pronounced as it is spelled: no "hour"


def es_conjugate(infinitive: str, tense: str, person: int) -> str:
    """Regular Spanish conjugation: ``es_conjugate("hablar", "present", 3) == "hablamos"``."""
    stem, group = infinitive[:-2], infinitive[-2:]
    present, preterite = ES_ENDINGS[group]
    return stem + (present if tense == "present" else preterite)[person]


def en_conjugate(verb: str, tense: str, person: int) -> str:
    """English: the past has one form; the present adds -s for he/she/it (person 2)."""
    base, third, past = EN_VERBS[verb][0]
    if tense == "past":
        return past
    return third if person == 2 else base


def en_determiner_ok(det: str, noun: str, plural: bool) -> bool:
    if det in ("the", "my"):
        return True
    if det in ("a", "an"):
        return not plural and (det == "an") == (noun[0] in EN_VOWEL_SOUND)
    if det in ("this", "that"):
        return not plural
    return plural  # these, those


EN_DETERMINER_SWAP = {"a": "an", "an": "a", "this": "these", "these": "this", "that": "those", "those": "that"}
