//! A deterministic generator of long multi-session chats between two people, with questions
//! whose answer turns are known: the recall bench's data set (generated, so no licence to
//! worry about, and not any public set's distribution).
//!
//! Each conversation has 15–25 sessions of small talk (greetings, pleasantries, work,
//! weather, food, shows; some of it mentions the same nouns as the facts, as distractors), in
//! which about 30 personal facts are stated once (pets, moves, jobs, dates, preferences…),
//! some with a follow-up detail given in answer to the other person's question. Questions
//! paraphrase the fact: a third share its topic word, a third use another form of it
//! (possessive, plural, other tense), a third only a synonym or a related word.
//!
//! ```
//! let chats = ctxwin_benches::longchat::generate(7, 2);
//! assert_eq!(chats.len(), 2);
//! let chat = &chats[0];
//! assert!(chat.turns.len() > 500 && !chat.questions.is_empty());
//! for q in &chat.questions {
//!     assert!(q.evidence.iter().all(|&i| i < chat.turns.len()));
//! }
//! assert_eq!(ctxwin_benches::longchat::generate(7, 2), chats, "deterministic");
//! ```

/// One turn of a chat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// 0 for the first speaker (sent as `user`), 1 for the second (`assistant`).
    pub speaker: u8,
    /// What was said (one line).
    pub text: String,
    /// When, in milliseconds since the Unix epoch.
    pub timestamp: u64,
}

/// A question about a chat and the turns that hold its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// The question, asked by a third party about a speaker.
    pub text: String,
    /// Indices into [`Chat::turns`] of the turns that answer it.
    pub evidence: Vec<usize>,
    /// How the question relates to the fact's words: 0 same word, 1 other form, 2 synonym.
    pub kind: u8,
}

/// A generated conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chat {
    /// The two speakers' names.
    pub names: [String; 2],
    /// The turns, oldest first.
    pub turns: Vec<Turn>,
    /// Questions about it.
    pub questions: Vec<Question>,
}

/// SplitMix64: small, seeded, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items.get(self.below(items.len())).copied().unwrap_or("")
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const NAMES: &[&str] = &[
    "Caroline", "Melanie", "Jon", "Gina", "Tomas", "Priya", "Daniel", "Aiko", "Rosa", "Marcus",
    "Leila", "Oskar", "Nadia", "Ethan", "Chloe", "Ravi", "Sofia", "Liam", "Hana", "Victor",
];

/// Value pools; fillers reuse them as distractors.
const ANIMALS: &[&str] = &["puppy", "kitten", "rabbit", "parrot", "hamster", "tortoise"];
const PETNAMES: &[&str] = &["Biscuit", "Pickle", "Mochi", "Ziggy", "Pepper", "Waffles", "Noodle"];
const BREEDS: &[&str] = &["beagle mix", "tabby", "lop-eared one", "grey African", "dwarf one"];
const CITIES: &[&str] =
    &["Lisbon", "Denver", "Osaka", "Edinburgh", "Montreal", "Valencia", "Tucson"];
const MONTHS: &[&str] = &["January", "March", "April", "June", "August", "October", "November"];
const JOBS: &[&str] =
    &["nurse", "data analyst", "pastry chef", "librarian", "carpenter", "UX designer"];
const COMPANIES: &[&str] = &["robotics", "shipping", "solar energy", "publishing", "gaming"];
const INSTRUMENTS: &[&str] = &["cello", "ukulele", "saxophone", "banjo", "harp", "drums"];
const SIBLINGS: &[&str] = &["sister", "brother", "cousin"];
const SIBNAMES: &[&str] = &["Ingrid", "Mateo", "Bea", "Kofi", "Yara", "Felix"];
const FOODS: &[&str] = &["ramen", "paella", "dumplings", "lasagna", "tacos al pastor", "pho"];
const RACES: &[&str] = &["Chicago marathon", "city half-marathon", "trail ultra", "charity 10K"];
const BOOKS: &[&str] =
    &["The Remains of the Day", "Pachinko", "Station Eleven", "Beloved", "Circe"];
const ALLERGENS: &[&str] = &["peanuts", "shellfish", "sesame", "kiwi", "cats"];
const COLORS: &[&str] = &["red", "dark green", "silver", "yellow", "navy blue"];
const CARS: &[&str] =
    &["Subaru wagon", "used Prius", "Volvo estate", "Mini Cooper", "pickup truck"];
const HOBBIES: &[&str] =
    &["pottery", "watercolor painting", "rock climbing", "knitting", "birdwatching"];
const COUNTRIES: &[&str] = &["Iceland", "Portugal", "Vietnam", "Peru", "Morocco", "Norway"];
const SUBJECTS: &[&str] =
    &["accounting", "marine biology", "nursing", "architecture", "psychology"];
const PLACES: &[&str] = &["animal shelter", "food bank", "community library", "youth center"];
const PLANTS: &[&str] = &["sunflowers", "tulips", "dahlias", "lavender", "peonies"];
const TEAMS: &[&str] = &["the Celtics", "Arsenal", "the Packers", "Benfica", "the Yankees"];
const LANGUAGES: &[&str] = &["Korean", "Portuguese", "Italian", "Turkish", "Swahili"];
const DESSERTS: &[&str] = &["lemon tart", "carrot cake", "apple crumble", "cheesecake", "baklava"];
const BODYPARTS: &[&str] = &["ankle", "wrist", "knee", "shoulder"];
const BANDS: &[&str] =
    &["Arctic Monkeys", "Fleetwood Mac tribute", "Radiohead", "Khruangbin", "Bon Iver"];
const KIDNAMES: &[&str] = &["Luna", "Ava", "Maya", "Ella", "Zoe"];
const TEACHERS: &[&str] = &["Mrs. Okafor", "Mr. Lindqvist", "Ms. Rivera", "Mr. Haddad"];

/// A fact: the statement, an optional (question, answer) follow-up, and the questions.
struct Fact {
    statement: String,
    follow_up: Option<(String, String)>,
    /// (question, kind); `{P}` is the speaker's name.
    questions: Vec<(String, u8)>,
    /// Questions answered by the follow-up's answer turn.
    detail_questions: Vec<(String, u8)>,
}

fn fact(rng: &mut Rng, which: usize) -> Fact {
    let f = |s: &str| s.to_string();
    let mut detail_questions = Vec::new();
    let mut follow_up = None;
    let (statement, questions) = match which {
        0 => {
            let (a, n, b) = (rng.pick(ANIMALS), rng.pick(PETNAMES), rng.pick(BREEDS));
            follow_up = Some((
                f("Oh my gosh, what kind is it?"),
                format!("A {b}, super energetic and very cuddly."),
            ));
            detail_questions.push((format!("What breed is {{P}}'s {a}?"), 1));
            (
                format!("Big news, I adopted a {a} from the shelter and we named it {n}."),
                vec![
                    (format!("What did {{P}} name the {a} from the shelter?"), 0),
                    (format!("What is the name of {{P}}'s {a}?"), 1),
                    (f("What is {P}'s new companion animal called?"), 2),
                ],
            )
        }
        1 => {
            let (c, m) = (rng.pick(CITIES), rng.pick(MONTHS));
            (
                format!("We finally moved to {c} in {m}, the new apartment is near the harbor."),
                vec![
                    (f("Which city did {P} move to?"), 0),
                    (f("Where is {P}'s new apartment located?"), 1),
                    (f("Where does {P} live these days?"), 2),
                ],
            )
        }
        2 => {
            let (j, c) = (rng.pick(JOBS), rng.pick(COMPANIES));
            (
                format!("I started a new job as a {j} at a small {c} company."),
                vec![
                    (f("What is {P}'s new job?"), 0),
                    (f("Where did {P} start working?"), 1),
                    (f("What does {P} do for a living now?"), 2),
                ],
            )
        }
        3 => {
            let (i, t) = (rng.pick(INSTRUMENTS), rng.pick(TEACHERS));
            follow_up = Some((
                f("That's so cool! Who's teaching you?"),
                format!("{t}, she played in an orchestra for twenty years."),
            ));
            detail_questions.push((f("Who gives {P} the lessons?"), 2));
            (
                format!(
                    "I've been learning the {i} for three months now, practicing every evening."
                ),
                vec![
                    (f("Which instrument is {P} learning?"), 0),
                    (f("What has {P} been practising in the evenings?"), 1),
                    (f("What music lessons is {P} taking?"), 2),
                ],
            )
        }
        4 => {
            let (s, n, m, c) =
                (rng.pick(SIBLINGS), rng.pick(SIBNAMES), rng.pick(MONTHS), rng.pick(CITIES));
            (
                format!("My {s} {n} is getting married in {m}, the ceremony will be in {c}."),
                vec![
                    (format!("When is {n} getting married?"), 0),
                    (format!("Where is {{P}}'s {s}'s ceremony?"), 1),
                    (format!("When is the wedding of {{P}}'s {s}?"), 2),
                ],
            )
        }
        5 => {
            let food = rng.pick(FOODS);
            (
                format!("Honestly my favorite food is {food}, I could eat it every single day."),
                vec![
                    (f("What is {P}'s favorite food?"), 0),
                    (f("Which dish could {P} eat every day?"), 1),
                    (f("What meal does {P} love the most?"), 2),
                ],
            )
        }
        6 => {
            let (r, m) = (rng.pick(RACES), rng.pick(MONTHS));
            (
                format!("I signed up for the {r} in {m}, my first one ever!"),
                vec![
                    (f("Which race did {P} sign up for?"), 0),
                    (f("What is {P} signing up for this year?"), 1),
                    (f("What event is {P} training for?"), 2),
                ],
            )
        }
        7 => {
            let b = rng.pick(BOOKS);
            (
                format!("I just finished reading {b}, it made me cry at the end."),
                vec![
                    (f("Which book did {P} finish reading?"), 0),
                    (f("What was {P} reading that made them cry?"), 1),
                    (f("What novel did {P} recommend?"), 2),
                ],
            )
        }
        8 => {
            let a = rng.pick(ALLERGENS);
            (
                format!("Turns out I'm allergic to {a}, the doctor confirmed it on Tuesday."),
                vec![
                    (f("What is {P} allergic to?"), 0),
                    (f("What allergies did the doctor find for {P}?"), 1),
                    (f("What does {P} have to avoid?"), 2),
                ],
            )
        }
        9 => {
            let (c, car) = (rng.pick(COLORS), rng.pick(CARS));
            (
                format!("We bought a {c} {car}, it's our first car together."),
                vec![
                    (f("What car did {P} buy?"), 0),
                    (f("What colour are {P}'s cars?"), 1),
                    (f("What vehicle did {P} get recently?"), 2),
                ],
            )
        }
        10 => {
            let h = rng.pick(HOBBIES);
            (
                format!("I've taken up {h} on weekends, it really calms me down."),
                vec![
                    (f("What hobby did {P} take up?"), 0),
                    (f("What does {P} do on the weekend to calm down?"), 1),
                    (f("How does {P} relax lately?"), 2),
                ],
            )
        }
        11 => {
            let (c, m) = (rng.pick(COUNTRIES), rng.pick(MONTHS));
            (
                format!("For our anniversary we are flying to {c} in {m}."),
                vec![
                    (f("Where is {P} going for the anniversary?"), 0),
                    (f("Which country is {P} flying to?"), 1),
                    (f("Where is {P}'s next vacation?"), 2),
                ],
            )
        }
        12 => {
            let (m, d, age) = (rng.pick(MONTHS), 1 + rng.below(28), 25 + rng.below(20));
            (
                format!("My birthday is on {m} {d}, I'm turning {age} this year."),
                vec![
                    (f("When is {P}'s birthday?"), 0),
                    (f("How old is {P} turning this year?"), 1),
                    (f("On what date was {P} born?"), 2),
                ],
            )
        }
        13 => {
            let s = rng.pick(SUBJECTS);
            (
                format!("I'm going back to school to study {s} at night."),
                vec![
                    (f("What is {P} studying at school?"), 0),
                    (f("What subject is {P} studying at night?"), 1),
                    (f("What degree is {P} pursuing?"), 2),
                ],
            )
        }
        14 => {
            let p = rng.pick(PLACES);
            (
                format!("Every Saturday I volunteer at the {p}, mostly helping with the kids."),
                vec![
                    (f("Where does {P} volunteer?"), 0),
                    (f("What does {P} do on Saturdays?"), 1),
                    (f("Where does {P} help out with children?"), 2),
                ],
            )
        }
        15 => {
            let p = rng.pick(PLANTS);
            (
                format!("I planted {p} in the garden and they finally bloomed."),
                vec![
                    (f("What did {P} plant in the garden?"), 0),
                    (f("Which flowers are blooming for {P}?"), 1),
                    (f("What is growing in {P}'s yard?"), 2),
                ],
            )
        }
        16 => {
            let t = rng.pick(TEAMS);
            (
                format!("I've supported {t} since I was a kid, never missed a game on TV."),
                vec![
                    (f("Which team does {P} support?"), 0),
                    (f("What team has {P} been supporting since childhood?"), 1),
                    (f("Who does {P} cheer for?"), 2),
                ],
            )
        }
        17 => {
            let l = rng.pick(LANGUAGES);
            (
                format!("I'm learning {l} with an app because my partner's family speaks it."),
                vec![
                    (f("Which language is {P} learning?"), 0),
                    (f("What languages does {P}'s partner's family speak?"), 1),
                    (f("What is {P} practicing on their phone?"), 2),
                ],
            )
        }
        18 => {
            let d = rng.pick(DESSERTS);
            (
                format!("I baked a {d} for the neighbors and they loved it."),
                vec![
                    (f("What did {P} bake for the neighbors?"), 0),
                    (f("What did {P}'s neighbor love?"), 1),
                    (f("What dessert did {P} make?"), 2),
                ],
            )
        }
        19 => {
            let b = rng.pick(BODYPARTS);
            (
                format!("I sprained my {b} while hiking, so no running for a while."),
                vec![
                    (f("What did {P} sprain?"), 0),
                    (f("How did {P} get hurt on the hike?"), 1),
                    (f("What injury does {P} have?"), 2),
                ],
            )
        }
        20 => {
            let b = rng.pick(BANDS);
            (
                format!("We saw {b} live last night, best concert of my life."),
                vec![
                    (f("Which band did {P} see live?"), 0),
                    (f("What concerts did {P} go to?"), 1),
                    (f("Who performed at the show {P} attended?"), 2),
                ],
            )
        }
        _ => {
            let k = rng.pick(KIDNAMES);
            follow_up = Some((
                f("Aww, how is she settling in?"),
                f("Great, she already has a best friend and cries when pickup comes."),
            ));
            detail_questions.push((f("How is {P}'s daughter adjusting?"), 2));
            (
                format!("Our daughter {k} just started kindergarten, she loves it."),
                vec![
                    (f("What is {P}'s daughter's name?"), 0),
                    (f("Who just started kindergarten?"), 1),
                    (f("How is {P}'s little girl doing at school?"), 2),
                ],
            )
        }
    };
    Fact { statement, follow_up, questions, detail_questions }
}

const FACT_KINDS: usize = 22;

const GREETINGS: &[&str] = &[
    "Hey {O}! How's your week going?",
    "Hi {O}, long time no talk!",
    "Good morning {O}! Got a minute to chat?",
    "Hey hey, {O}! What's new with you?",
];
const PLEASANTRIES: &[&str] = &[
    "Thanks, {O}!",
    "Haha, totally.",
    "That sounds amazing!",
    "Aww, that's so sweet.",
    "Oh wow, really?",
    "Ha, I know the feeling.",
    "Same here, honestly.",
    "Love that for you!",
    "No way!",
    "Yeah, exactly.",
    "Hmm, fair enough.",
    "You're the best, {O}.",
];
const GOODBYES: &[&str] = &[
    "Anyway, I have to run. Talk soon, {O}!",
    "Okay, dinner's ready. Catch you later!",
    "Good chatting, {O}. Take care!",
    "Gotta go, the meeting is starting. Bye!",
];
/// Small talk; `{X}` takes a value from the fact pools (a distractor).
const CHATTER: &[&str] = &[
    "Work has been crazy this week, so many meetings that could have been emails.",
    "The weather here has been grey and rainy for days, I miss the sun.",
    "I watched a documentary about octopuses last night, they are so clever.",
    "Traffic this morning was unreal, it took me an hour to get across town.",
    "My coworker brought {FOOD} to the office and now everyone wants the recipe.",
    "I keep seeing ads for trips to {COUNTRY}, the algorithm knows me too well.",
    "My neighbor's {ANIMAL} keeps escaping into our yard, it's kind of adorable.",
    "Someone at the gym was talking about the {RACE}, sounds brutal.",
    "I started a new show on Friday and stayed up way too late watching it.",
    "We tried a new coffee place downstairs, the oat latte is surprisingly good.",
    "My phone screen cracked again, third time this year.",
    "I read an article saying {CITY} is getting really expensive to live in.",
    "The kids next door were playing {TEAM} highlights on full volume all evening.",
    "I cleaned the whole kitchen yesterday and it already looks messy again.",
    "My mom called to ask about the holidays, she's planning early as usual.",
    "There was a street fair downtown with live music and way too many food trucks.",
    "I've been trying to drink more water, the app keeps nagging me about it.",
    "We had a power outage for two hours, I read by candlelight like it was 1850.",
    "A friend of mine is learning {LANGUAGE} too, she says the grammar is wild.",
    "I finally fixed the squeaky door, it only took three videos and a lot of patience.",
    "The grocery store was out of everything, I ended up buying random snacks.",
    "I'm thinking about rearranging the living room, the couch is in a weird spot.",
    "Did you see the sunset yesterday? The sky was pink and orange for ages.",
    "I tried {HOBBY} once years ago and it was a disaster, so respect.",
    "My laptop decided to update in the middle of a presentation, classic.",
    "The bakery near me makes a {DESSERT} that is honestly dangerous.",
    "I've been sleeping badly, the neighbors upstairs move furniture at midnight.",
    "We went for a long walk by the river, the ducks were very confident.",
];
const QUESTIONS_BACK: &[&str] = &[
    "What about you, anything fun planned?",
    "How's everything on your end?",
    "Did you end up doing anything this weekend?",
    "How are the plans coming along?",
];

const DAYS: &[&str] =
    &["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MOODS: &[&str] =
    &["exhausting", "weirdly quiet", "pretty chill", "a blur", "long", "productive", "hectic"];
const TAILS: &[&str] = &[
    " Anyway, {DAY} was {MOOD}.",
    " {DAY} felt {MOOD} too.",
    " Not sure why, but {DAY} was {MOOD}.",
    " Also {DAY} was {MOOD}, so I slept at {HOUR}.",
];

/// Small talk with a varied tail, so fillers rarely repeat word for word.
fn chatter(rng: &mut Rng, other: &str) -> String {
    let mut text = fill(rng.pick(CHATTER), other, rng);
    if rng.chance(60) {
        let tail = rng
            .pick(TAILS)
            .replace("{DAY}", rng.pick(DAYS))
            .replace("{MOOD}", rng.pick(MOODS))
            .replace("{HOUR}", &format!("{}", 9 + rng.below(4)));
        text.push_str(&tail);
    }
    text
}

fn fill(template: &str, other: &str, rng: &mut Rng) -> String {
    let mut text = template.replace("{O}", other);
    for (slot, pool) in [
        ("{FOOD}", FOODS),
        ("{COUNTRY}", COUNTRIES),
        ("{ANIMAL}", ANIMALS),
        ("{RACE}", RACES),
        ("{CITY}", CITIES),
        ("{TEAM}", TEAMS),
        ("{LANGUAGE}", LANGUAGES),
        ("{HOBBY}", HOBBIES),
        ("{DESSERT}", DESSERTS),
    ] {
        if text.contains(slot) {
            text = text.replace(slot, rng.pick(pool));
        }
    }
    text
}

/// `count` conversations from `seed`.
pub fn generate(seed: u64, count: usize) -> Vec<Chat> {
    (0..count).map(|i| chat(seed.wrapping_mul(1_000_003).wrapping_add(i as u64))).collect()
}

fn chat(seed: u64) -> Chat {
    let mut rng = Rng(seed);
    let first = rng.below(NAMES.len());
    let second = (first + 1 + rng.below(NAMES.len() - 1)) % NAMES.len();
    let names = [NAMES[first].to_string(), NAMES[second].to_string()];
    let sessions = 15 + rng.below(11);
    // Facts: each kind at most once per speaker, spread over all but the last two sessions.
    let mut facts: Vec<(usize, u8, Fact)> = Vec::new();
    for speaker in 0..2u8 {
        for kind in 0..FACT_KINDS {
            if rng.chance(70) {
                let at = rng.below(sessions.saturating_sub(2).max(1));
                facts.push((at, speaker, fact(&mut rng, kind)));
            }
        }
    }
    let mut turns: Vec<Turn> = Vec::new();
    let mut questions = Vec::new();
    let day = 86_400_000u64;
    let start = 1_672_531_200_000u64; // 2023-01-01
    for session in 0..sessions {
        let mut clock = start + session as u64 * (3 + rng.below(9) as u64) * day;
        let mut say = |turns: &mut Vec<Turn>, speaker: u8, text: String, rng: &mut Rng| {
            clock += 20_000 + rng.below(120_000) as u64;
            turns.push(Turn { speaker, text, timestamp: clock });
            turns.len() - 1
        };
        let opener = rng.below(2) as u8;
        let other = |s: u8| names[usize::from(1 - s)].clone();
        say(&mut turns, opener, fill(rng.pick(GREETINGS), &other(opener), &mut rng), &mut rng);
        let mut speaker = 1 - opener;
        let mut due: Vec<Fact> = Vec::new();
        let mut owners: Vec<u8> = Vec::new();
        for (at, owner, _) in &facts {
            if *at == session {
                owners.push(*owner);
            }
        }
        let mut here: Vec<(u8, Fact)> = Vec::new();
        let mut rest = Vec::new();
        for (at, owner, fact) in facts.drain(..) {
            if at == session { here.push((owner, fact)) } else { rest.push((at, owner, fact)) }
        }
        facts = rest;
        due.clear();
        let length = 24 + rng.below(20);
        let mut placed = 0;
        for step in 0..length {
            // Place the session's facts at spread-out points.
            let slot =
                if here.is_empty() { usize::MAX } else { length * (placed + 1) / (here.len() + 1) };
            if step >= slot && placed < here.len() {
                let (owner, fact) = &here[placed];
                placed += 1;
                let owner = *owner;
                if speaker != owner {
                    say(
                        &mut turns,
                        speaker,
                        fill(rng.pick(QUESTIONS_BACK), "", &mut rng),
                        &mut rng,
                    );
                }
                let at = say(&mut turns, owner, fact.statement.clone(), &mut rng);
                let person = &names[usize::from(owner)];
                for (q, kind) in &fact.questions {
                    questions.push(Question {
                        text: q.replace("{P}", person),
                        evidence: vec![at],
                        kind: *kind,
                    });
                }
                speaker = 1 - owner;
                if let Some((ask, answer)) = &fact.follow_up {
                    say(&mut turns, speaker, ask.clone(), &mut rng);
                    let detail = say(&mut turns, owner, answer.clone(), &mut rng);
                    for (q, kind) in &fact.detail_questions {
                        questions.push(Question {
                            text: q.replace("{P}", person),
                            evidence: vec![detail],
                            kind: *kind,
                        });
                    }
                } else {
                    let reply = fill(rng.pick(PLEASANTRIES), person, &mut rng);
                    say(&mut turns, speaker, reply, &mut rng);
                }
                speaker = 1 - speaker;
                continue;
            }
            let text = if rng.chance(30) {
                fill(rng.pick(PLEASANTRIES), &other(speaker), &mut rng)
            } else {
                let a = chatter(&mut rng, &other(speaker));
                if rng.chance(40) { format!("{a} {}", chatter(&mut rng, "")) } else { a }
            };
            say(&mut turns, speaker, text, &mut rng);
            speaker = 1 - speaker;
        }
        let closer = fill(rng.pick(GOODBYES), &other(speaker), &mut rng);
        say(&mut turns, speaker, closer, &mut rng);
        let _ = owners;
    }
    Chat { names, turns, questions }
}
