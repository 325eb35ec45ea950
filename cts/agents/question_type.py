"""Question-type classifier for diagnostics: which kinds of missing detail a clarifying question
asks about. A question may ask about several ("Which city and which year?" is region and time).

`classify` uses keyword rules in English and Chinese (no model call, reproducible);
`classify_with_model` asks a model (the `question_classifier` role) for one to three types.
Both return the types in the canonical `QUESTION_TYPES` order, never empty, and `other` only
alone. `bench/question_types.py` measures both against the hand-labelled
tests/data/question_types.tsv.

What each type means (the labelling guide of that table, the model prompt and these rules
follow the same decisions):

- time: when, which date/year/month/season/period, or how recent ("latest", "最新", "current",
  "历史"). A duration that delimits the period the results cover ("how many years back",
  "最近几年") is time *and* numeric; a duration as a plain amount ("how many years of
  experience", "how long will you stay", "多久") is numeric only.
- region: where — a country, state/province, city, town, village, district, neighbourhood,
  "local"/"nearby", domestic vs abroad, where the user is or goes ("Are you in London?",
  "你在上海吗？", "去哪"), and places offered as alternatives ("US or UK?", "北京还是上海",
  "朝阳区还是海淀区"). A place named only as context ("Which Tokyo hotel?") is not region.
  "state" is region only as a place ("which state", "US state", "state or province"), never
  in "state of the art" / "current state" / "state of development";
  "area" is region ("which area do you live in") but "area of AI" / "research area" is scope.
- scope: which part, aspect, subtopic, field, category, kind, purpose or depth of the topic,
  and what to include or leave out. "What kind of" / "哪种" / "什么类型" is scope (it narrows
  the topic to a sub-category), not definition; "field" / "领域" / "area of X" is scope.
- entity: which specific named thing — product, model, brand, version, organisation, person,
  work, or named technology. "Which model" is entity. A bare "which …" / "哪个…" whose noun no
  other rule knows is entity (it picks one specific thing).
- numeric: a quantity — how many/much/long/old/far, price, budget, size, age, distance,
  a limit or a numeric range.
- definition: what a term means or which sense of it is meant ("what do you mean by 'light'",
  "“便宜”是指…"). A bare "do you mean" / "你指的是" is not definition: "Which year do you
  mean?" / "你指的是哪一年？" ask about time.
- other: none of the above (format, meta or open questions).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from cts.agents.prompts import render
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

QuestionType = Literal["time", "region", "scope", "entity", "numeric", "definition", "other"]
QUESTION_TYPES: tuple[QuestionType, ...] = get_args(QuestionType)

#: Most types one question is given by the model; three covers every multi-type question of
#: the labelled table ("which city, which year and what budget").
MAX_TYPES = 3


@dataclass(frozen=True)
class Rule:
    """One concept, with an English and a Chinese pattern (both required: en/zh parity)."""

    kind: QuestionType
    concept: str
    en: str
    zh: str


# Places a clarifying question names when it offers alternatives ("US or UK?", "北京还是上海？")
# or asks where the user is ("Are you in London?", "你在上海吗？"). A place named as context
# ("Which Tokyo hotel?", "北京的房价你想看哪一年的？") is not region: these lists only count
# beside an alternative or an "are you in". Capitalised abbreviations are matched case-
# sensitively (`US`, not the pronoun "us").
_PLACES_EN = (
    "america|north america|south america|latin america|europe|asia|africa|oceania|antarctica"
    "|middle east|southeast asia|east asia|scandinavia|the balkans|the caribbean"
    "|china|japan|korea|south korea|india|russia|germany|france|italy|spain|portugal|canada"
    "|mexico|brazil|argentina|chile|australia|new zealand|britain|great britain|england"
    "|scotland|wales|northern ireland|ireland|netherlands|belgium|switzerland|austria|sweden"
    "|norway|denmark|finland|poland|greece|turkey|egypt|israel|iran|iraq|saudi arabia"
    "|singapore|malaysia|indonesia|thailand|vietnam|philippines|pakistan|bangladesh|nigeria"
    "|kenya|south africa|ukraine|hong kong|taiwan|macau|mainland china"
    "|california|texas|florida|new york|new jersey|illinois|ohio|michigan|massachusetts"
    "|pennsylvania|arizona|colorado|oregon|nevada|virginia|north carolina|ontario|quebec"
    "|british columbia|alberta|bavaria|london|paris|berlin|madrid|rome|tokyo|osaka|seoul"
    "|beijing|shanghai|shenzhen|guangzhou|sydney|melbourne|toronto|vancouver|montreal"
    "|chicago|los angeles|san francisco|seattle|boston|washington d\\.?c\\.?|dubai|mumbai"
    "|delhi|bangalore|moscow|istanbul|amsterdam|vienna|zurich|munich|milan|barcelona"
    "|dublin|edinburgh|manchester|stockholm|copenhagen|oslo|helsinki|prague|warsaw"
    "|(?-i:US|USA|U\\.S\\.?|UK|U\\.K\\.?|EU|UAE|NYC|LA)"
)
#: "where in …" a text, not a place: a part of it (scope).
_IN_A_TEXT = (
    r"(the|this|that|your|my|a|an) (document|text|file|code|book|paper|article|page|report"
    r"|chapter|section|video|list|table|spreadsheet|email|message|form|app|program|output|log"
    r"|script|image|story|film|movie|game|song|slides?|thesis|contract|manual|docs?)\b"
)
#: The head word of a proper name that names a thing, not a place (Paris Agreement, New York
#: Times, London Marathon): matched case-sensitively after a capitalised word.
_NAMED_THING_HEADS = (
    "Agreement|Protocol|Accords?|Treaty|Convention|Declaration|Act|Times|Post|Journal|Herald"
    "|Tribune|Gazette|Marathon|Open|Cup|Games|Award|Prize|Festival|Museum|Institute|University"
    "|College|Bank|Airlines?|Airways|Exchange|Index|Group|Inc|Ltd|Corp|FC|Orchestra|Opera"
)
#: After a place name: not the start of a proper noun it belongs to (a capitalised word).
_NOT_A_NAME = "(?!(?-i: [A-Z]))"
_PLACES_ZH = (
    "中国|美国|英国|日本|韩国|德国|法国|加拿大|澳大利亚|澳洲|俄罗斯|印度|新加坡|马来西亚|泰国"
    "|越南|意大利|西班牙|荷兰|瑞士|瑞典|新西兰|巴西|墨西哥|欧盟|欧洲|亚洲|非洲|北美|南美|东南亚"
    "|中东|欧美|日韩|港澳台|港澳|内地|大陆|海外|北京|上海|天津|重庆|广州|深圳|杭州|南京|苏州"
    "|成都|武汉|西安|长沙|郑州|青岛|厦门|大连|宁波|合肥|济南|沈阳|哈尔滨|昆明|东莞|佛山|无锡"
    "|珠海|三亚|拉萨|桂林|广东|浙江|江苏|山东|河南|河北|湖北|湖南|四川|福建|安徽|江西|云南"
    "|贵州|广西|山西|陕西|甘肃|辽宁|吉林|黑龙江|内蒙古|新疆|西藏|青海|宁夏|海南|台湾|香港|澳门"
)
# A Chinese place name by its suffix, in an alternative (朝阳区还是海淀区): the words for
# markets (股市, 楼市, 超市, 上市 …) are not places.
_ZH_PLACE_BY_SUFFIX = (
    "[\u4e00-\u9fff]{1,3}(?<![股楼车超黑夜菜门上债币牛熊城])市"
    "|[\u4e00-\u9fff]{1,3}(?<![误禁专园景社])区|[\u4e00-\u9fff]{1,3}[省县镇村]"
)

# Every rule fires independently: a question gets every type whose rules match. English
# patterns are matched case-insensitively with word boundaries; Chinese has no word boundaries,
# so its patterns carry their own guards (look-arounds) against the usual compound-word traps.
RULES: tuple[Rule, ...] = (
    # --- time -------------------------------------------------------------------------------
    Rule(
        "time",
        "when",
        # "When you say 'X', …" asks for a definition, not a time.
        r"\bwhen\b(?! you (say|said|write|wrote))|\bwhat time\b|\bsince when\b",
        r"什么时候|何时|哪天|哪一天|几号|几点",
    ),
    Rule(
        "time",
        "calendar unit",
        # "how many years" / "per year" / "years old" are amounts (numeric), not a when.
        r"(?<!how many )(?<!per )\b(years?|months?|weeks?|dates?|days?|seasons?"
        r"|quarters?|decades?|centur(y|ies)|eras?|periods?|deadlines?|timelines?)\b(?! old\b)"
        r"|\btime ?(frame|period|range|span|window)s?\b",
        r"哪一?年|哪几年|年份|年代|年度|哪个?月|几月|月份|日期|季度|季节|旺季|淡季|时期|时段"
        r"|期间|期限|截止|世纪|(?<!多长)(?<!多少)(?<!多久)时间|哪一?届",
    ),
    Rule(
        "time",
        "parts of the day, week and year; before or after",
        # "How many nights" is an amount; "night train" a thing: nights are left out.
        r"\b(weekdays?|weekends?|mornings?|afternoons?|evenings?|semesters?|summer|winter"
        r"|autumn|spring)\b|\bbefore or after\b",
        r"上半年|下半年|上半月|下半月|[上下本这]个?(月|周|星期|季度)|周末|工作日|节假日|寒假|暑假"
        r"|春节|国庆|假期|上午|下午|晚上|早上|凌晨|几时|周几|星期几|礼拜几|[之以]?前还是.{0,6}后",
    ),
    Rule(
        "time",
        "recency: latest / recent / current / historical",
        # "latest" and "最新" are the same concept: each language's pattern must have it.
        # "currently live/based" asks where, not when.
        r"\b(latest|newest|newer|recent|recently|nowadays|up[- ]to[- ]date|upcoming|future|histor"
        r"(y|ical)|ago|older|past|this year|last year|next year)\b"
        r"|\bcurrent(ly)?\b(?! (live|living|based|located|reside|residing|work|working)\b)",
        # "今年几岁/今年多大" asks an age.
        r"最新|最近|近期|近年|近几|目前|当前|如今|现阶段|今年(?!几岁|多大)|去年|明年|前年|未来|将来|历史"
        r"|过去|以前|早期|新款|老款|旧款|往前推",
    ),
    Rule(
        "time",
        "an explicit year",
        r"(?<!\d)(19|20)\d\d(?!\d)",
        r"(?<!\d)(19|20)\d\d(?!\d)",
    ),
    Rule(
        "time",
        "a duration that delimits the period the results cover (time as well as numeric)",
        r"\bhow many (years|months|weeks|days) (back|ago|of (data|history|records|coverage))\b",
        r"(过去|最近|近|往前)(几|多少)(年|个月|周|天)",
    ),
    # --- region -----------------------------------------------------------------------------
    Rule(
        "region",
        "where",
        # "Where did you see/read that term?" asks for a source, "where in the document?" for a
        # part of it: not a place. 去哪儿网 is a company.
        r"\bwhere\b(?! (did|do) you (see|hear|read|find|get))"
        rf"(?! in {_IN_A_TEXT})",
        r"哪里|哪儿(?!网)|哪边|何处|什么地方|哪个地方",
    ),
    Rule(
        "region",
        "place nouns",
        # "take place" / "first place" are not places.
        r"\b(countr(y|ies)|cit(y|ies)|towns?|villages?|regions?|locations?|provinces?|count(y|ies)"
        r"|districts?|neighbou?rhoods?|continents?|suburbs?|address|zip code|post ?code"
        r"|boroughs?|municipalit(y|ies)|prefectures?|cantons?|destinations?|time ?zones?)\b"
        r"|(?<!take )(?<!took )(?<!takes )(?<!taking )(?<!first )\bplaces?\b",
        # 哪个市场 / 哪个区块链 / 哪国产 are no places.
        # 国家队 (a national team), 国家级 (a level), 国家大剧院 (a venue), 国家标准 (a standard).
        r"国家(?![队级大标])|城市|地区|区域|地点|位置|省份|哪一个省|县城|乡镇|街道|社区|小区|哪个洲"
        r"|大洲|哪座"
        r"|哪(个|一个)?(省|县|镇|乡|村|州|国(?![产货语])|市(?![场值面民])|区(?![块别间分]))"
        r"|省市|地级市|县级市|直辖市|市区|城区|郊区|城镇|农村|乡村|乡下",
    ),
    Rule(
        "region",
        "where the user is or goes",
        # "Are you in London?" names the place; "live in", "based in" ask where, whatever
        # follows. 去哪 / 在哪 without a noun after it (在哪个行业 is scope).
        r"\b(live|lives|living|based|located|staying|reside|residing) (in|near|around)\b"
        rf"|\b(are|were) you (currently |now |still )?(in|at|near|from) (the )?({_PLACES_EN})\b",
        r"[去到在住]哪(?![个一些种类款家位部本]|儿网)"
        rf"|在({_PLACES_ZH})[省市]?[^？?。，,]{{0,4}}(吗|么|呢)",
    ),
    Rule(
        "region",
        "places offered as alternatives",
        # A place name before a capitalised word names something else (Paris Agreement,
        # New York Times, London Marathon).
        rf"\b({_PLACES_EN})\b{_NOT_A_NAME}[^?.!;]{{0,20}}?\b(or|vs\.?|versus)\b"
        rf"|\b(or|vs\.?|versus) (the |in |for |in the |for the )?({_PLACES_EN})\b{_NOT_A_NAME}",
        rf"({_PLACES_ZH}|{_ZH_PLACE_BY_SUFFIX})的?(还是|或者?)"
        rf"|(还是|或者?)({_PLACES_ZH}|{_ZH_PLACE_BY_SUFFIX})",
    ),
    Rule(
        "region",
        "area as a place",
        # "Which area do you live in?" is a place; "area of AI", "research area" are scope.
        r"(?<!research )(?<!study )(?<!subject )(?<!practice )(?<!focus )(?<!interest )"
        r"\bareas?\b(?! of\b)|\bparts? of (the )?(town|city|country|world|state)\b",
        r"片区|哪一带|哪块区域",
    ),
    Rule(
        "region",
        "state / province as a place",
        # Only place senses: "which state", "US state", "state or province". Never "state of
        # the art", "state of development", "the current state of …".
        # "Which state is your application in?" asks a status; a home or a company is somewhere.
        r"\b(which|what|your|u\.?s\.?|american|australian|indian|german|mexican|brazilian) "
        r"states?\b(?![- ]of\b)(?! (is|are) (your|the|this|that|my|its|their|our) "
        r"(?!(home|house|address|office|company|business|school|college|university|property"
        r"|apartment|flat|store|shop|event|wedding|trip|hotel|clinic|hospital|firm|farm"
        r"|residence|family|team|branch)\b)\w+ in\b)"
        r"|\bstates? or (province|countr|territor)|\b(province|country)"
        r" or states?\b",
        r"哪个州|哪一个州|州或|或州|州还是|还是州",
    ),
    Rule(
        "region",
        "nearby / local / domestic vs abroad",
        # "local variable", "local copy", "local minimum" are no places.
        r"\b(nearby|near (you|me)|local(ly)?(?! (variables?|scope|storage|files?|cop(y|ies)"
        r"|branch(es)?|repo(sitor(y|ies))?|machines?|models?|servers?|cache|install(ation)?|host"
        r"|network|minim(um|a)|maxim(um|a)|optim(um|a)|search|changes?|commits?|env(ironment)?s?"
        r"|path|disk|drive)\b)|domestic(ally)?|international(ly)?|abroad"
        r"|overseas|worldwide|nationwide|intercontinental|cross-border)\b",
        r"附近|周边|本地|当地|国内|国外|海外|境外|国际|全国|全球|出境|跨境",
    ),
    # --- scope ------------------------------------------------------------------------------
    Rule(
        "scope",
        "aspect / part / subtopic",
        r"\b(aspects?|facets?|angles?|sub-?topics?|topics?|features?|categor(y|ies)|genres?"
        r"|((which|what) parts?|parts? of)(?! (of )?(the )?(town|city|country|world|state))"
        r"|sections?"
        r"|components?|what (information|content)|perspectives?|points? of view|viewpoints?)\b"
        rf"|\bwhere in {_IN_A_TEXT}",
        r"方面|哪部分|哪一部分|部分|角度|主题|话题|内容|功能|类别|门类|题材|关心的是|关注的是|关注点",
    ),
    Rule(
        "scope",
        "field / domain / area of X (not a place)",
        # "area of the city" is a place (region), not a field.
        r"\b(fields?|domains?|disciplines?|sub-?fields?|sectors?|industr(y|ies)"
        r"|areas? of(?! (the |this |that )?(city|town|country|region|state|capital|island))"
        r"|(research|study|subject|practice|focus|interest) areas?)\b",
        r"领域|行业|学科|方向|专业|板块",
    ),
    Rule(
        "scope",
        "what kind of (a sub-category of the topic, not a definition)",
        r"\b(what|which) (kinds?|types?|sorts?) of\b|\b(what|which) (kind|type|sort)\b",
        r"哪种|哪一种|哪类|哪一类|什么类型|什么样|什么种类|种类|类型",
    ),
    Rule(
        "scope",
        "include / exclude / restrict / focus",
        r"\b(include|including|exclude|excluding|only|limit(ed)? to|restrict(ed)?|focus(ed)?"
        r"|in particular|particularly|cover(ed)?)\b",
        r"包括|包含|排除|只看|只要|只需|仅|限于|聚焦|专注|重点|侧重|特别是|尤其",
    ),
    Rule(
        "scope",
        "purpose / use case",
        r"\b(purpose|use case|used for|intended use|personal use|business use|for work)\b",
        r"用途|用来|用于|目的|场景|做什么用|个人使用|商业使用|日常使用|自用|家用|办公用|学习用"
        r"|研究用|工作用",
    ),
    Rule(
        "scope",
        "depth / level",
        r"\b(beginner|advanced|introduct(ion|ory)|overview|in-depth|level of detail"
        r"|how detailed)\b",
        r"入门|进阶|概述|概览|深入|详细程度|多详细|详细的(分析|介绍|说明|解读)|简单介绍|简要|概括"
        r"|摘要",
    ),
    # --- entity -----------------------------------------------------------------------------
    Rule(
        "entity",
        "who",
        r"\bwho(m|se)?\b",
        r"谁|哪位|哪一位",
    ),
    Rule(
        "entity",
        "product / brand / model / version",
        r"\b(brands?|models?|manufacturers?|vendors?|suppliers?|products?|devices?|versions?"
        r"|editions?|apps?|software|platforms?|websites?|tools?|(which|what) makes?)\b",
        # Chinese text has no word boundary before a Latin "app".
        r"品牌|牌子|型号|厂商|厂家|制造商|供应商|产品|设备|版本|应用程序|(?<![a-z])apps?(?![a-z])"
        r"|软件|平台|网站|工具|哪款|哪一款",
    ),
    Rule(
        "entity",
        "organisation",
        r"\b(compan(y|ies)|firms?|organi[sz]ations?|institutions?|universit(y|ies)|colleges?"
        r"|hospitals?|clinics?|banks?|airlines?|agenc(y|ies)|teams?|clubs?|stores?|shops?"
        r"|retailers?|restaurants?|hotels?|publishers?|journals?|newspapers?)\b",
        r"公司|企业|机构|组织|大学|学校|医院|诊所|银行|航空公司|球队|俱乐部|商店|门店|店铺|餐厅"
        r"|酒店|出版社|期刊|报纸|哪家|哪一家",
    ),
    Rule(
        "entity",
        "person / work / named thing",
        r"\b(authors?|artists?|singers?|actors?|directors?|players?|name of|called|named|books?"
        r"|movies?|films?|songs?|albums?|games?|drugs?|medications?|programming languages?"
        r"|frameworks?|librar(y|ies))\b",
        r"作者|艺术家|歌手|演员|导演|球员|人物|名字|名称|叫什么|书名|哪本|哪部|电影|歌曲|专辑|游戏"
        r"|药品|药物|编程语言|框架",
    ),
    Rule(
        "entity",
        "a proper name of a thing (an agreement, a newspaper, an event, a site)",
        rf"(?-i:\b[A-Z][\w'’.-]* ({_NAMED_THING_HEADS})\b)",
        # 去哪儿网, 携程网: a site by its name; 哪支 (队): which team; 剧院: a venue.
        r"[\u4e00-\u9fff]{2,4}网(?![络上页站友民])|哪支|剧院",
    ),
    # --- numeric ----------------------------------------------------------------------------
    Rule(
        "numeric",
        "how many / how much / how long …",
        r"\bhow (many|much|long|old|big|large|far|often|tall|heavy|fast|expensive|cheap)\b",
        # 几 is "how many" except in 哪几 (which ones), 几乎 (almost), 几月/几号/几点 (when).
        # 周几 / 星期几 / 几时 ask when.
        r"多少|(?<!哪)(?<!周)(?<!星期)(?<!礼拜)几(?![月号点乎时])|多大|多长|多久|多远|多高|多重"
        r"|多贵|多快|多宽",
    ),
    Rule(
        "numeric",
        "money: price / budget / cost",
        r"\b(prices?|pricing|costs?|budgets?|afford(able)?|spend|fees?|salar(y|ies)|income|rent"
        r"|cheap(er)?|expensive|dollars?|euros?|yuan)\b|[$€£¥]\s?\d",
        # 元 only after a number (元旦, 单元, 元素 are not money).
        r"价格|价位|价钱|预算|费用|成本|花费|钱|\d\s*[元块]|工资|薪资|收入|租金|便宜|实惠",
    ),
    Rule(
        "numeric",
        "measures and limits",
        # "model/version number" names a thing; "date range" is a time; "Stone Age" is an era.
        r"(?<!model )(?<!version )(?<!phone )\bnumbers?\b|\b(amount|quantity|capacity|size"
        r"|weight|height|length|distance|speed|mileage|storage|ram|percent(age)?|minimum|maximum"
        r"|at least|at most|upper limit|lower limit|threshold|square (metres|meters|feet))\b"
        r"|(?<!stone )(?<!middle )(?<!iron )(?<!bronze )\bages?\b"
        r"|(?<!date )(?<!time )(?<!year )\branges?\b",
        r"数量|人数|数目|个数|金额|尺寸|大小|面积|容量|内存|重量|身高|长度|距离|年龄|岁|速度|里程"
        r"|百分比|比例|最多|最少|至少|最高|最低|上限|下限|以内|不超过|(?<!时间)(?<!日期)区间",
    ),
    # --- definition -------------------------------------------------------------------------
    Rule(
        "definition",
        "what a term means",
        # A bare "do you mean" / "are you referring to" is not definition: "Which year do you
        # mean?" asks about time.
        r"\bmean(t)? by\b|\bmeanings?\b|\bwhat (does|do|did) .{1,40} (mean|refer to)\b"
        r"|\bdefin(e|ed|ition|itions)\b|\b(which|what|in what) sense\b|\bstands? for\b"
        r"|\babbreviation\b|\bacronym\b|\binterpret|\bwhen you say\b",
        r"什么意思|啥意思|意思是|含义|涵义|定义|指什么|指的是什么|是指什么|哪种意思|哪个意思"
        r"|哪层意思|缩写|全称|代表什么|怎么理解|理解为",
    ),
    Rule(
        "definition",
        "a quoted term that the question asks to explain",
        # "By 'cheap' …" / "你说的“便宜”…": the user's own word, quoted back to be explained.
        r"\b(by|you say|you said) [\"'“‘]|[\"'“‘][^\"'”’]{1,40}[\"'”’],? (mean|refer|stand)",
        r"(说的|所说的|提到的)\s*[“\"「『‘]|[”\"」』’]\s*(是指|指的是|指)",
    ),
)

# "Which …" / "哪个…" whose noun no rule above knows picks one specific thing: entity. Only
# when nothing else matched, so "Which city?" stays region alone.
_WHICH_FALLBACK: Rule = Rule(
    "entity",
    "bare which",
    # "Which state is your application in?" asks a status (the state rule leaves it): other.
    r"\bwhich\b(?! states? (is|are)\b)",
    r"哪个|哪一个|哪些",
)

_COMPILED: list[tuple[QuestionType, re.Pattern[str]]] = [
    (rule.kind, re.compile(f"(?:{rule.en})|(?:{rule.zh})", re.IGNORECASE)) for rule in RULES
]
_FALLBACK = re.compile(f"(?:{_WHICH_FALLBACK.en})|(?:{_WHICH_FALLBACK.zh})", re.IGNORECASE)


def normalise(types: Iterable[str]) -> list[QuestionType]:
    """Canonical form of a set of types: `QUESTION_TYPES` order, no duplicates, `other` only
    when nothing else is there, never empty. Unknown names raise ValueError."""
    found = set(types)
    unknown = found - set(QUESTION_TYPES)
    if unknown:
        raise ValueError(f"unknown question types {sorted(unknown)}")
    kinds: list[QuestionType] = [t for t in QUESTION_TYPES if t in found and t != "other"]
    return kinds or ["other"]


def classify(question: str) -> list[QuestionType]:
    """Every type whose rules match, in canonical order; `["other"]` when none does."""
    found = {kind for kind, pattern in _COMPILED if pattern.search(question)}
    if not found and _FALLBACK.search(question):
        found.add("entity")
    return normalise(found)


def types_schema() -> dict[str, object]:
    """The JSON schema the model answers in: one to MAX_TYPES types.

    Deliberately without `uniqueItems`: no constrained decoder enforces it (outlines_core drops
    it, so the tiny model's ["entity", "entity", "entity"] then fails validation; vLLM's
    xgrammar backend rejects the request and llguidance reports it unimplemented). A repeated
    type is harmless: `normalise` drops duplicates."""
    return {
        "type": "object",
        "properties": {
            "types": {
                "type": "array",
                "items": {"type": "string", "enum": list(QUESTION_TYPES)},
                "minItems": 1,
                "maxItems": MAX_TYPES,
            }
        },
        "required": ["types"],
        "additionalProperties": False,
    }


#: Room for the longest answer: MAX_TYPES types as JSON.
SAMPLING = RoleSampling(max_tokens=48)


async def classify_with_model(
    engine: ChatModel, question: str, language: str, sampling: Sampling
) -> list[QuestionType]:
    """The model's types for `question`, normalised like `classify`. `sampling.max_tokens`
    must leave room for the JSON: 48 tokens hold the longest answer (three types)."""
    system, user = render("question_classifier", language, question=question)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=JsonSchemaOutput(name="question_types", json_schema=types_schema()),
        )
    )
    # The engine has already validated the answer against the schema.
    return normalise(response.parsed["types"])
